"""The application service (the use cases): load aggregates, ask them to change, save what changed in one transaction.

Synchronous on purpose (the eventsourcing library is); the service calls it from one writer
thread. Every command is safe to repeat: a repeated command finds the state already changed and
records nothing. Every command takes values, never an aggregate, so the Store can run one again
from its arguments when its save lost a race with another writer (handlers/writers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, DomainEventProtocol, MutableOrImmutableAggregate
from eventsourcing.persistence import JSONTranscoder, Recording

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import (
    DomainError, IllegalTransition, PathAlreadyClaimed, UnknownEnvironment, UnknownThread)
from bb_environments.domain.host_claims import HostClaims
from bb_environments.domain.hook_operations import MADE_EMPTY_REASON, RecordedHook
from bb_environments.domain.leases import NoFreePorts, PortRange, slug_base
from bb_environments.domain.status import CreateFailure, ThreadStatus
from bb_environments.domain.steps import SkipSetup, StartSetup
from bb_environments.domain.thread import Thread, thread_aggregate_id
from bb_environments.handlers.claiming import (
    HOST_CLAIMS_SNAPSHOT_INTERVAL, Claims, HeldPathsAsHolders, HostLeasesAsRecorded)
from bb_environments.handlers.host_registry import HostRegistry
from bb_environments.handlers.indexes import (
    AwaitingThreads, HookOperations, LiveEnvironments, LiveLimits, RegisteredThreads, WorktreeProjects)
from bb_environments.handlers.log_indexes import LogWatch
from bb_environments.handlers.placement import Placement
from bb_environments.handlers.writers import SingleWriter, Writers
from bb_environments.providers.contract import retire_grace_ms

T = TypeVar("T")
A = TypeVar("A", bound=Aggregate)
GraceLookup = Callable[[str], "int | None"]


class Environments(Application[UUID]):
    name = "Environments"
    log_section_size = 500
    snapshotting_intervals = {HostClaims: HOST_CLAIMS_SNAPSHOT_INTERVAL}

    def __init__(self, env: dict[str, str] | None = None, grace_for: GraceLookup | None = None,
                 writers: Writers | None = None, limits: LiveLimits | None = None,
                 ports: PortRange | None = None) -> None:
        """`writers`: who else may write the store (default: nobody, as with SQLite); `ports`: where
        each new environment's block of ports is leased from on its host."""
        self.writers = writers or SingleWriter()
        self.limits = limits or LiveLimits()
        self.ports = ports or PortRange()
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
        self._indexes = (*(holder.index for holder in (
            self.claims, self.hosts, self._registered, self._awaiting, self._hooks, self._live,
            self._worktree_projects)), self.claims.leases_index)

    @property
    def saves(self) -> int:
        """How many saves the application began: one that failed half way may still have written."""
        return self._saves

    def save(self, *objs: MutableOrImmutableAggregate[UUID] | DomainEventProtocol[UUID] | None,
             **kwargs: Any) -> list[Recording[UUID]]:
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
            aggregate: A = self.repository.get(aggregate_id,
                                               deepcopy_from_cache=to_change or self.repository.fastforward)
        except AggregateNotFoundError:
            raise unknown(f"no {kind.__name__.lower()} {name}") from None
        return aggregate

    def find_thread(self, thread_id: str) -> Thread | None:
        # Every new thread is looked up first: answered from the index, not by a query of the store.
        if thread_id not in self._registered:
            return None
        return self.thread(thread_id)

    def head(self) -> int:
        return self.recorder.max_notification_id() or 0

    # -- threads -------------------------------------------------------------------------------

    def register_thread(
        self,
        thread_id: str,
        project_path: str | None,
        parent_thread_id: str | None,
        host_id: str,
        intent: dict[str, Any] | None,
    ) -> Thread:
        """Register the thread (once)."""
        existing = self.find_thread(thread_id)
        if existing is not None:
            return existing
        thread = Thread(
            thread_id=thread_id,
            project_path=project_path,
            parent_thread_id=parent_thread_id,
            host_id=host_id,
            intent=intent,
        )
        self.save(thread)
        return thread

    def spawn_thread(
        self,
        thread_id: str,
        project_path: str | None,
        parent_thread_id: str | None,
        host_id: str,
        intent: dict[str, Any] | None,
        target: UUID | Placement,
    ) -> Environment:
        """Register a new thread, its first message's request and the environment it gets (`target`
        joined, or placed new) in one save: a refused spawn leaves no thread behind."""
        if self.find_thread(thread_id) is not None:
            raise IllegalTransition(f"thread {thread_id} already exists")
        thread = Thread(thread_id=thread_id, project_path=project_path, parent_thread_id=parent_thread_id,
                        host_id=host_id, intent=intent)
        thread.request_environment()
        environment, changed = self._provide(thread, target)
        self.save(*changed)
        return environment

    def threads_awaiting_environment(self) -> list[str]:
        threads: Iterator[Thread] = (self.repository.get(identity) for identity in self._awaiting.thread_ids())
        return [thread.thread_id for thread in threads if thread.awaits_environment]

    def refuse_thread(self, thread_id: str, message: str) -> None:
        """Refuse the environment the thread's first message asked for (the request is recorded
        with the refusal, if it was not yet)."""
        thread = self._changing_thread(thread_id)
        if thread.needs_environment and thread.refusal != message:
            thread.request_environment()
            thread.refuse(message)
            self.save(thread)

    def answer_first_message(self, thread_id: str, target: UUID | Placement) -> Environment:
        """Record the request of the thread's first message and give it its environment (`target`
        joined, or placed new), in one save."""
        thread = self._changing_thread(thread_id)
        thread.request_environment()
        environment, changed = self._provide(thread, target)
        self.save(*changed)
        return environment

    def provide_environment(self, thread_id: str, target: UUID | Placement) -> Environment:
        """Give the thread the environment its first message asked for: join `target`, or claim
        the placed new one."""
        environment, changed = self._provide(self._changing_thread(thread_id), target)
        self.save(*changed)
        return environment

    def claim_environment(
        self,
        thread_id: str,
        provider_id: str,
        host_id: str,
        project_path: str | None,
        inputs: Any,
        path_key: str,
        claimed_path: str | None,
        share_held_path: bool = False,
    ) -> Environment:
        placement = Placement(provider_id, host_id, project_path, inputs, path_key, claimed_path, share_held_path)
        return self.provide_environment(thread_id, placement)

    def attach_thread(self, thread_id: str, environment_id: UUID) -> Environment:
        return self.provide_environment(thread_id, environment_id)

    def _provide(self, thread: Thread, target: UUID | Placement) -> tuple[Environment, list[Aggregate]]:
        """The thread's environment and every aggregate changed to give it, not saved yet."""
        if isinstance(target, UUID):
            return self._attach(thread, target)
        return self._new_environment(thread, target)

    def _new_environment(self, thread: Thread, placement: Placement) -> tuple[Environment, list[Aggregate]]:
        """Reserve a new environment for the thread and claim its path, all or nothing.

        A path held by an environment of the same provider is no conflict in two cases. With
        `shares_claimed_path`, the thread joins that environment if it takes threads. Otherwise,
        an idle holder that does not own the path gives it up: its removal starts in the same save.
        """
        if thread.environment_id is not None:
            return self.environment(thread.environment_id), []
        if thread.status != ThreadStatus.ACTIVE:
            raise IllegalTransition(f"thread {thread.thread_id} is archived")
        host_id, claimed_path = placement.host_id, placement.claimed_path
        holder = self._holder(host_id, claimed_path, placement.provider_id) if claimed_path else None
        if placement.shares_claimed_path and holder is not None and holder.takes_threads:
            return self._attach(thread, holder.id)
        replaced = holder if holder is not None and holder.can_give_up_path else None
        # One whose removal this save starts does not count: its place is handed on.
        self._live.refuse_past(self.limits, host_id, placement.project_path, handed_on=1 if replaced else 0)
        claims = self.claims.on_host(host_id)
        # The block is chosen against the ports the host's plan found listening: one placed while
        # the host was away leases its block when it is planned there (record_planned).
        slug, ports = claims.choose_lease(slug_base(placement.project_path, placement.provider_id),
                                          self.ports if placement.planned else None, placement.listening)
        environment = Environment(
            provider_id=placement.provider_id,
            host_id=host_id,
            project_path=placement.project_path,
            inputs=placement.inputs,
            path_key=placement.path_key,
            claimed_path=claimed_path,
            thread_id=thread.thread_id,
            **({} if placement.planned else {"planned": False}),
            slug=slug, ports=ports.recorded() if ports else None,
        )
        claims.lease(environment.id, slug, ports)
        thread.assign_environment(environment.id)
        if replaced is not None:
            replaced.give_up_path()
        if claimed_path:
            claims.take(claimed_path, environment.id, replaced.id if replaced else None)
        return environment, [environment, thread, *([replaced] if replaced else []), *claims.changed]

    def _holder(self, host_id: str, path: str, provider_id: str) -> Environment | None:
        """The environment of `provider_id` that holds exactly `path`, if one does."""
        holder_id = self.claims.holder(host_id, path)
        if holder_id is None:
            return None
        holder = self._changing_environment(holder_id)
        return holder if holder.provider_id == provider_id else None

    def _attach(self, thread: Thread, environment_id: UUID) -> tuple[Environment, list[Aggregate]]:
        environment = self._changing_environment(environment_id)
        if thread.environment_id not in (None, environment_id):
            raise IllegalTransition(f"thread {thread.thread_id} already uses environment {thread.environment_id}")
        environment.attach_thread(thread.thread_id)
        thread.assign_environment(environment_id)
        return environment, [environment, thread]

    def archive_thread(self, thread_id: str, now: datetime) -> Environment | None:
        thread = self._changing_thread(thread_id)
        if not thread.archive():
            return None
        environment = self._environment_of(thread)
        if environment is not None:
            environment.detach_thread(thread_id, now, self._grace_for(environment.provider_id))
        self.save(thread, *([environment] if environment else []))
        return environment

    def unarchive_thread(self, thread_id: str) -> Environment | None:
        thread = self._changing_thread(thread_id)
        if not thread.unarchive():
            return None
        environment = self._environment_of(thread)
        if environment is not None and environment.is_live and not environment.cancelled:
            environment.attach_thread(thread_id)
        else:
            thread.leave_environment()
            environment = None
        self.save(thread, *([environment] if environment else []))
        return environment

    def cancel_thread_message(self, thread_id: str) -> Environment | None:
        thread = self._changing_thread(thread_id)
        environment = self._environment_of(thread)
        if environment is None or not environment.cancel_for_thread(thread_id):
            return None
        thread.leave_environment()
        self.save(environment, thread)
        return environment

    def _environment_of(self, thread: Thread) -> Environment | None:
        return self._changing_environment(thread.environment_id) if thread.environment_id else None

    # -- the steps the provisioning handler drives ---------------------------------------------

    def _change(self, environment_id: UUID, change: Callable[[Environment], T]) -> tuple[Environment, T]:
        environment = self._changing_environment(environment_id)
        outcome = change(environment)
        self.save(environment)
        return environment, outcome

    def record_created(
        self,
        environment_id: UUID,
        attempt: int,
        path: str,
        owns_path: bool,
        merge_base_branch: str | None,
        resource: dict[str, Any] | None,
        empty: bool = False,
    ) -> Environment:
        """Record the provider's path, and the setup's start (or skip) it makes due; a path other than
        the claimed one is claimed in the same save. `empty`: the provider made the path just now
        and put nothing in it, so a setup due is skipped here rather than started on the host."""
        environment = self._changing_environment(environment_id)
        claims = self.claims.on_host(environment.host_id)
        if path != environment.claimed_path and attempt == environment.attempt:
            try:
                claims.take(path, environment.id)
            except PathAlreadyClaimed as refused:
                environment.record_create_failed(attempt, "terminal", f"{path} is already claimed: {refused}")
                self.save(environment)
                return environment
        if environment.record_created(attempt, path, owns_path, merge_base_branch, resource):
            _take_recording_step(environment, empty)
            self.save(environment, *claims.changed)
        return environment

    def record_planned(self, environment_id: UUID, attempt: int, project_path: str | None, inputs: Any,
                       claimed_path: str | None, listening: tuple[int, ...] = ()) -> Environment:
        """The host's plan for an environment placed while its host was away, with its claim taken
        and its block of ports leased (free of the `listening` ports the host found) in the same
        save; a path another environment holds, or no free block, fails the attempt for good instead.
        One claimed by a release before leases (no slug) leases none: its release promised none."""
        environment = self._changing_environment(environment_id)
        claims = self.claims.on_host(environment.host_id)
        ports = None
        if environment.may_plan(attempt):
            try:
                if claimed_path:
                    claims.take(claimed_path, environment.id)
                if environment.slug is not None:
                    _, ports = claims.choose_lease(None, self.ports, listening)
                    claims.lease(environment.id, environment.slug, ports)
            except PathAlreadyClaimed as refused:
                environment.record_create_failed(attempt, "terminal", f"cannot claim the workspace path: {refused}")
                self.save(environment)
                return environment
            except NoFreePorts as refused:
                environment.record_create_failed(attempt, "terminal", str(refused))
                self.save(environment)
                return environment
        if environment.record_planned(attempt, project_path, inputs, claimed_path, ports):
            self.save(environment, *claims.changed)
        return environment

    def note_host_awaited(self, environment_id: UUID, message: str) -> Environment:
        return self._change(environment_id, lambda e: e.note_host_awaited(message))[0]

    def record_create_failed(self, environment_id: UUID, attempt: int, failure: CreateFailure,
                             message: str) -> Environment:
        return self._change(environment_id, lambda e: e.record_create_failed(attempt, failure, message))[0]

    def start_setup(self, environment_id: UUID) -> tuple[Environment, bool]:
        return self._change(environment_id, lambda e: e.start_setup(e.setup_operation()))

    def skip_setup(self, environment_id: UUID, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.skip_setup(reason))[0]

    def record_setup_outcome(
        self, environment_id: UUID, operation_id: str, succeeded: bool, message: str | None
    ) -> Environment:
        return self._change(environment_id, lambda e: e.record_setup_outcome(operation_id, succeeded, message))[0]

    def record_setup_skipped(self, environment_id: UUID, operation_id: str, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.record_setup_skipped(operation_id, reason))[0]

    def record_resource(self, environment_id: UUID, resource: dict[str, Any] | None) -> Environment:
        return self._change(environment_id, lambda e: e.record_resource(resource))[0]

    def record_paused(self, environment_id: UUID, resource: dict[str, Any] | None, now: datetime) -> Environment:
        return self._change(environment_id, lambda e: e.record_paused(resource, now))[0]

    def record_resumed(self, environment_id: UUID, resource: dict[str, Any] | None) -> Environment:
        return self._change(environment_id, lambda e: e.record_resumed(resource))[0]

    def retry(self, environment_id: UUID, path_key: str, claimed_path: str | None) -> Environment:
        """Retry a failed step; a new attempt on another path moves the claim in the same save."""
        environment = self._changing_environment(environment_id)
        previous_claim = environment.claimed_path
        environment.retry(path_key, claimed_path)
        claims = self.claims.on_host(environment.host_id)
        if environment.claimed_path != previous_claim:
            if environment.claimed_path:
                claims.take(environment.claimed_path, environment.id)
            if previous_claim:
                claims.release(previous_claim, environment.id)
        self.save(environment, *claims.changed)
        return environment

    def record_attempt_cleaned(self, environment_id: UUID, attempt: int) -> Environment:
        return self._change(environment_id, lambda e: e.record_attempt_cleaned(attempt))[0]

    def request_deletion(self, environment_id: UUID) -> Environment:
        return self._change(environment_id, lambda e: e.request_deletion())[0]

    def start_removal(self, environment_id: UUID, now: datetime) -> tuple[Environment, bool]:
        return self._change(environment_id, lambda e: e.start_removal(now) or e.retry_removal(now))

    def start_teardown(self, environment_id: UUID) -> tuple[Environment, bool]:
        return self._change(environment_id, lambda e: e.start_teardown(e.teardown_operation()))

    def skip_teardown(self, environment_id: UUID, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.skip_teardown(reason))[0]

    def record_teardown_outcome(
        self, environment_id: UUID, operation_id: str, outcome: str, message: str | None
    ) -> Environment:
        return self._change(environment_id, lambda e: e.record_teardown_outcome(operation_id, outcome, message))[0]

    def record_teardown_skipped(self, environment_id: UUID, operation_id: str, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.record_teardown_skipped(operation_id, reason))[0]

    def record_removed(self, environment_id: UUID, removal_attempt: int, saved_ref: str | None = None) -> Environment:
        """Removal succeeded: the environment ends (with where its work was saved) and its path
        claims are released in the same save."""
        environment = self._changing_environment(environment_id)
        claimed = {p for p in (environment.claimed_path, environment.path) if p}
        if not environment.record_removed(removal_attempt, saved_ref):
            return environment
        claims = self.claims.on_host(environment.host_id)
        for path in claimed:
            claims.release(path, environment.id)
        claims.end_lease(environment.id)
        self.save(environment, *claims.changed)
        return environment

    def record_remove_failed(
        self, environment_id: UUID, removal_attempt: int, message: str, retry_at: datetime
    ) -> Environment:
        return self._change(environment_id, lambda e: e.record_remove_failed(removal_attempt, message, retry_at))[0]

    def environment_hosts(self, environment_ids: list[UUID]) -> dict[UUID, str]:
        """The host each of these environments was placed on, for those the log has (an
        environment's host never changes)."""
        hosts = {}
        for environment_id in environment_ids:
            try:
                found: Aggregate = self.repository.get(environment_id, deepcopy_from_cache=self.repository.fastforward)
            except AggregateNotFoundError:
                continue
            if isinstance(found, Environment):  # an id of another aggregate names no environment
                hosts[environment_id] = found.host_id
        return hosts

    def recorded_hook(self, operation_id: str) -> RecordedHook | None:
        """Whose hook the log started under this operation id, where, and whether it may run or be
        stopped now; None when the log never started one (whatever the id looks like)."""
        started = self._hooks.started(operation_id)
        if started is None:
            return None
        environment_id, kind = started
        return self.environment(environment_id).hook_record(operation_id, kind)

    def unfinished_environment_ids(self) -> list[UUID]:
        """Every environment whose log does not end in Removed: what recovery must drive on."""
        return self._live.ids()

    # -- what bb doctor compares with the hosts ---------------------------------------------------

    def live_environments(self) -> list[Environment]:
        """Every environment not removed, as the log has it now."""
        return [self.environment(environment_id) for environment_id in self.unfinished_environment_ids()]

    def worktree_projects(self) -> dict[str, list[str]]:
        """By host, the projects git-worktree environments were claimed in, removed ones included:
        where worktrees and branches of bb's layout can be."""
        return self._worktree_projects.by_host()

    def record_workspace_vanished(self, environment_id: UUID, path: str) -> Environment:
        """The workspace at `path` is gone from its host; a claim on it beside the claimed path
        (the provider chose another) is released in the same save, as a removal releases it."""
        environment = self._changing_environment(environment_id)
        if not environment.record_workspace_vanished(path):
            return environment
        claims = self.claims.on_host(environment.host_id)
        if path != environment.claimed_path:
            claims.release(path, environment.id)
        self.save(environment, *claims.changed)
        return environment


def _take_recording_step(environment: Environment, empty: bool) -> None:
    """Take the aggregate's next step now if it only records (start or skip the setup): saved with
    the change that made it due, it costs no transaction, and no round of the driver, of its own.
    A crash finds the same state it would find after the driver had recorded the step.

    In an `empty` workspace the setup due is skipped: the host would find no script there, and
    asking it costs a hook record, a round trip and a save of their own. That decision is taken
    here, not by the aggregate's `next_step`, because `empty` is what the provider says of this
    one creation, not state the aggregate keeps."""
    match environment.next_step(datetime.now(timezone.utc)):
        case StartSetup() if empty:
            environment.skip_setup(MADE_EMPTY_REASON)
        case StartSetup():
            environment.start_setup(environment.setup_operation())
        case SkipSetup(reason):
            environment.skip_setup(reason)
