"""The eventsourcing application the use cases share: its saves, counted and folded into the log
indexes (handlers/indexes.py, handlers/log_indexes.py), and the lookups of its aggregates.

The use cases are in handlers/thread_use_cases.py and handlers/provisioning_steps.py; the
application service that has them all is handlers/application.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, DomainEventProtocol, MutableOrImmutableAggregate
from eventsourcing.persistence import JSONTranscoder, Recording

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import DomainError, UnknownEnvironment, UnknownPool, UnknownThread
from bb_environments.domain.leases import PortRange
from bb_environments.domain.pool import POOL_LIST_ID, Pool, PoolList
from bb_environments.domain.thread import Thread, thread_aggregate_id
from bb_environments.handlers.claiming import Claims, HeldPathsAsHolders, HostLeasesAsRecorded
from bb_environments.handlers.host_registry import HostRegistry
from bb_environments.handlers.indexes import (
    AwaitingThreads,
    HookOperations,
    LiveEnvironments,
    LiveLimits,
    RegisteredThreads,
    WorktreeProjects,
)
from bb_environments.handlers.log_indexes import LogWatch
from bb_environments.handlers.writers import SingleWriter, Writers
from bb_environments.providers.contract import retire_grace_ms

A = TypeVar("A", bound=Aggregate)
POOL_MAX_FAILURES = 3
GraceLookup = Callable[[str], "int | None"]


class IndexedApplication(Application[UUID]):
    def __init__(
        self,
        env: dict[str, str] | None = None,
        grace_for: GraceLookup | None = None,
        writers: Writers | None = None,
        limits: LiveLimits | None = None,
        ports: PortRange | None = None,
    ) -> None:
        """`writers`: who else may write the store (default: nobody, as with SQLite); `ports`: where
        each new environment's block of ports is leased from on its host."""
        self.writers = writers or SingleWriter()
        self.limits = limits or LiveLimits()
        self.ports = ports or PortRange()
        self.pool_max_failures = POOL_MAX_FAILURES
        """BB_POOL_MAX_FAILURES: a pool pauses after this many member setups failed in a row."""
        super().__init__(env={**(env or {}), **self.writers.application_settings()})
        self._grace_for = grace_for or (lambda provider_id: retire_grace_ms(None, None))
        self.on_saved: Callable[[], object] = lambda: None
        """Called by the Store once the saves of a batch of commands are durable (handlers/store.py)."""
        self._saves = 0
        # Indexes folded from the log, each read on from where it left off.
        self.log_watch = watch = LogWatch(self, lambda: self._saves)
        self.claims = Claims(self, self.writers, watch)
        self.hosts = HostRegistry(self, self.writers, watch, self.save)
        self._registered = RegisteredThreads(self, self.writers, watch)
        self._awaiting = AwaitingThreads(self, self.writers, watch)
        self._hooks = HookOperations(self, self.writers, watch)
        self._live = LiveEnvironments(self, self.writers, watch)
        self._worktree_projects = WorktreeProjects(self, self.writers, watch)
        self._indexes = (
            *(
                holder.index
                for holder in (
                    self.claims,
                    self.hosts,
                    self._registered,
                    self._awaiting,
                    self._hooks,
                    self._live,
                    self._worktree_projects,
                )
            ),
            self.claims.leases_index,
        )

    @property
    def saves(self) -> int:
        """How many saves the application began: one that failed half way may still have written."""
        return self._saves

    def save(
        self, *objs: MutableOrImmutableAggregate[UUID] | DomainEventProtocol[UUID] | None, **kwargs: Any
    ) -> list[Recording[UUID]]:
        """The library's save, counted, with its recordings folded into the log indexes."""
        self._saves += 1  # before the write: a save that fails half way may still have written
        recordings = super().save(*objs, **kwargs)
        for index in self._indexes:
            index.saved(recordings)
        return recordings

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        super().register_transcodings(transcoder)
        transcoder.register(HeldPathsAsHolders())
        transcoder.register(HostLeasesAsRecorded())

    # -- lookups -------------------------------------------------------------------------------

    # The lookups return an aggregate to read only: the cached one itself, not a copy (a deep copy
    # per read was a fifth of the writer's time in a burst). A cached aggregate never changes once
    # cached: a command changes a copy (`_changing_...`), and its save caches that copy in its place,
    # unless the cache is fast-forwarded (a shared store), which changes the cached aggregate in place.

    def environment(self, environment_id: UUID) -> Environment:
        return self._get(Environment, environment_id, str(environment_id), UnknownEnvironment, to_change=False)

    def thread(self, thread_id: str) -> Thread:
        return self._get(Thread, thread_aggregate_id(thread_id), thread_id, UnknownThread, to_change=False)

    def _changing_environment(self, environment_id: UUID) -> Environment:
        return self._get(Environment, environment_id, str(environment_id), UnknownEnvironment, to_change=True)

    def _changing_thread(self, thread_id: str) -> Thread:
        return self._get(Thread, thread_aggregate_id(thread_id), thread_id, UnknownThread, to_change=True)

    def _get(self, kind: type[A], aggregate_id: UUID, name: str, unknown: type[DomainError], to_change: bool) -> A:
        try:
            aggregate: A = self.repository.get(
                aggregate_id, deepcopy_from_cache=to_change or self.repository.fastforward
            )
        except AggregateNotFoundError:
            raise unknown(f"no {kind.__name__.lower()} {name}") from None
        return aggregate

    def find_pool(self, pool_id: UUID, to_change: bool = False) -> Pool | None:
        try:
            found: Aggregate = self.repository.get(
                pool_id, deepcopy_from_cache=to_change or self.repository.fastforward
            )
        except AggregateNotFoundError:
            return None
        return found if isinstance(found, Pool) else None

    def pool(self, pool_id: UUID, to_change: bool = False) -> Pool:
        found = self.find_pool(pool_id, to_change)
        if found is None:
            raise UnknownPool(f"no pool {pool_id}; `bb pool list` names them")
        return found

    def find_pool_list(self, to_change: bool = False) -> PoolList | None:
        try:
            found: Aggregate = self.repository.get(
                POOL_LIST_ID, deepcopy_from_cache=to_change or self.repository.fastforward
            )
        except AggregateNotFoundError:
            return None
        return found if isinstance(found, PoolList) else None

    def find_thread(self, thread_id: str) -> Thread | None:
        # Every new thread is looked up first: answered from the index, not by a query of the store.
        if thread_id not in self._registered:
            return None
        return self.thread(thread_id)

    def head(self) -> int:
        return self.recorder.max_notification_id() or 0
