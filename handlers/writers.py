"""How many processes write the event store, and what the application service may take for granted
because of it: one strategy, chosen per store kind where the service is assembled.

A SQLite store has one writer: `bb serve` holds a lock beside the file, and its Store runs every
command on one thread. A PostgreSQL store may be shared by several core replicas, each of which
must expect the log to have grown, and an aggregate to have changed, since it last looked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar
from uuid import UUID

from eventsourcing.application import Application

from bb_environments.handlers.log_indexes import Fold, LogIndex, LogWatch, SingleWriterLogIndex


class Writers(ABC):
    """What one strategy decides: the aggregate cache's fast-forward, how the log indexes read, how
    the nested-path rule is enforced, and how often a command that lost a race is run."""

    fastforward: ClassVar[bool]
    """Whether a cached aggregate is brought up to date from the store on every lookup."""
    claims_per_host: ClassVar[bool]
    """Whether each host's live claims are kept in a HostClaims aggregate saved with every change of
    a claim there, so that the store serialises the nested-path decisions (domain/host_claims.py)."""
    command_tries: ClassVar[int]
    """How many times the Store runs a command whose save conflicted with another writer's."""
    snapshots: ClassVar[bool]
    """Whether the application keeps snapshots (of the HostClaims aggregates, which only this kind
    of store keeps, and which grow for ever): a store without them saves every lookup of an
    aggregate not cached a query of the snapshots."""

    @abstractmethod
    def log_index(
        self, app: Application[UUID], watch: LogWatch, aggregate: type, event_names: tuple[str, ...], fold: Fold
    ) -> LogIndex:
        """An index of the log's `event_names` events of `aggregate`; `watch` is the app's (its saves, the head)."""

    def application_settings(self) -> dict[str, str]:
        """The settings of the application's cache and snapshots this strategy needs, for its environment."""
        return {
            "AGGREGATE_CACHE_FASTFORWARD": "y" if self.fastforward else "n",
            "IS_SNAPSHOTTING_ENABLED": "y" if self.snapshots else "n",
        }


class SingleWriter(Writers):
    """Nobody else can have written an aggregate's events since this writer cached what it saved,
    nor grown the log since it last read it: the cache is trusted without reading the store, an
    index reads only after a save of its own, and the nested-path rule is checked against the
    claims the log index holds. A conflict cannot come from a race, so it is not run again."""

    fastforward = False
    claims_per_host = False
    command_tries = 1
    snapshots = False

    def log_index(
        self, app: Application[UUID], watch: LogWatch, aggregate: type, event_names: tuple[str, ...], fold: Fold
    ) -> LogIndex:
        return SingleWriterLogIndex(app, watch, aggregate, event_names, fold)


class SharedStore(Writers):
    """Other writers may save at any moment: every lookup fast-forwards the cached aggregate, every
    index reads on from where it stopped, each host's claims are decided on its HostClaims, and a
    command whose save conflicted decides again on what the other writer saved."""

    fastforward = True
    claims_per_host = True
    command_tries = 20
    snapshots = True

    def log_index(
        self, app: Application[UUID], watch: LogWatch, aggregate: type, event_names: tuple[str, ...], fold: Fold
    ) -> LogIndex:
        return LogIndex(app, watch, aggregate, event_names, fold)
