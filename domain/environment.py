"""The Environment aggregate: one workspace's lifecycle, as a sequence of named facts.

    creating ──Created──► provisioning ──SetupSucceeded/Skipped + Ready──► ready
       │                      │
       └──CreateFailed──►   error ◄──SetupFailed
    ready|error ──(last thread left)──RetireScheduled──► retiring ──RemovalStarted──► removing ──[WorkSaved]─Removed──► removed
    ready|error ──WorkspaceVanished──► error (no workspace: a retry creates one)

Commands check the rules and either record events or raise a DomainError that records nothing.
Answers to asynchronous steps (a create, a hook, a removal) name the attempt or operation they
answer; an answer for anything but the current one is stale and changes nothing, so a late or
redelivered answer is harmless.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.copying import CopiedForCommands
from bb_environments.domain.disk import worth_recording
from bb_environments.domain.errors import IllegalTransition, ThreadsStillLive
from bb_environments.domain.hook_operations import HookKind, RecordedHook
from bb_environments.domain.leases import PortBlock
from bb_environments.domain.status import (
    LIVE_STATUSES,
    PREPARING_STATUSES,
    SETTLED_STATUSES,
    CreateFailure,
    EnvironmentStatus,
    HookStatus,
)
from bb_environments.domain.steps import (
    BindMember,
    CancelSetup,
    CleanAttempt,
    PauseWhenIdle,
    Remove,
    Resume,
    ResumeOnActivity,
    RetryRemoval,
    RetryTransient,
    RunCreate,
    RunSetup,
    RunTeardown,
    Settled,
    SkipSetup,
    SkipTeardown,
    StartRemoval,
    StartSetup,
    StartTeardown,
    Step,
    StopCreate,
    WakeAt,
)

TRANSIENT_RETRIES = 3
"""A transient create failure is retried by itself this many times."""
TRANSIENT_RETRY_DELAY = timedelta(seconds=30)


class Environment(CopiedForCommands, Aggregate):
    # The event classes the @event decorators below define, as the rest of the code reads them
    # (`Created` keeps the base class's declaration: redeclaring a nested class is refused).
    if TYPE_CHECKING:
        Claimed: ClassVar[type[Aggregate.Created]]
        CreateFailed: ClassVar[type[Aggregate.Event]]
        AttemptCleaned: ClassVar[type[Aggregate.Event]]
        SetupSkipped: ClassVar[type[Aggregate.Event]]
        SetupSucceeded: ClassVar[type[Aggregate.Event]]
        SetupFailed: ClassVar[type[Aggregate.Event]]
        Ready: ClassVar[type[Aggregate.Event]]
        ResourceRecorded: ClassVar[type[Aggregate.Event]]
        Paused: ClassVar[type[Aggregate.Event]]
        ResumeRequested: ClassVar[type[Aggregate.Event]]
        Resumed: ClassVar[type[Aggregate.Event]]
        CreateRetried: ClassVar[type[Aggregate.Event]]
        SetupRetried: ClassVar[type[Aggregate.Event]]
        ThreadAttached: ClassVar[type[Aggregate.Event]]
        ThreadDetached: ClassVar[type[Aggregate.Event]]
        RetireScheduled: ClassVar[type[Aggregate.Event]]
        RetireCancelled: ClassVar[type[Aggregate.Event]]
        Cancelled: ClassVar[type[Aggregate.Event]]
        RemovalStarted: ClassVar[type[Aggregate.Event]]
        TeardownSkipped: ClassVar[type[Aggregate.Event]]
        TeardownFinished: ClassVar[type[Aggregate.Event]]
        WorkSaved: ClassVar[type[Aggregate.Event]]
        Removed: ClassVar[type[Aggregate.Event]]
        RemoveFailed: ClassVar[type[Aggregate.Event]]
        Planned: ClassVar[type[Aggregate.Event]]
        HostAwaited: ClassVar[type[Aggregate.Event]]
        WorkspaceVanished: ClassVar[type[Aggregate.Event]]
        Pooled: ClassVar[type[Aggregate.Event]]
        Bound: ClassVar[type[Aggregate.Event]]
        DiskMeasured: ClassVar[type[Aggregate.Event]]

        class SetupStarted(Aggregate.Event):
            operation_id: str

        class TeardownStarted(Aggregate.Event):
            operation_id: str

    @event("Claimed")
    def __init__(
        self,
        provider_id: str,
        host_id: str,
        project_path: str | None,
        inputs: Any,
        path_key: str,
        claimed_path: str | None,
        thread_id: str,
        planned: bool = True,
        slug: str | None = None,
        ports: dict[str, int] | None = None,
        pool_id: str | None = None,
        base_commit: str | None = None,
        setup_hash: str | None = None,
    ) -> None:
        """`pool_id`: a member of that pool, claimed by no thread (`thread_id` empty), prepared on
        `base_commit` with the setup script of content hash `setup_hash` (domain/pool.py).
        `planned` False: placed while its host's agent was away, so the project, inputs and
        claimed path are as the request gave them, to be planned on the host before its create
        (see record_planned); environments of earlier releases were all planned at placement.
        `slug` and `ports`: what it leased on its host (domain/leases.py; `ports` once planned);
        None in environments claimed by a release before leases, which keep none."""
        self.provider_id = provider_id
        self.host_id = host_id
        self.project_path = project_path
        self.inputs = inputs
        self.path_key = path_key
        self.claimed_path = claimed_path
        self.origin_thread_id = thread_id
        self.planned = planned
        self.slug = slug
        self.ports = PortBlock.from_recorded(ports)
        self.pool_id = pool_id
        self.base_commit = base_commit
        self.setup_hash = setup_hash
        self.thread_path_key: str | None = None
        self.binding = False
        """Bound to a thread, its workspace not yet renamed for it (BindMember)."""
        self.thread_ids: list[str] = [] if pool_id else [thread_id]
        # The environment's version when each of its threads joined it: a thread that leaves and
        # comes back is placed again, and hears its outcome again (bus/core/placements.py).
        self.joined_at: dict[str, int] = {} if pool_id else {thread_id: 1}
        self.status = EnvironmentStatus.CREATING
        self.status_message: str | None = None
        self.attempt = 1
        self.path: str | None = None
        self.owns_path = False
        self.merge_base_branch: str | None = None
        self.resource: dict[str, Any] | None = None
        self.setup_status: HookStatus | None = None
        self.setup_operation_id: str | None = None
        self.setup_attempt = 0
        self.teardown_status: HookStatus | None = None
        self.teardown_operation_id: str | None = None
        self.retire_at: datetime | None = None
        self.cancelled = False
        self.failure: CreateFailure | None = None
        self.transient_failures = 0
        self.cleaned_attempt = 0
        self.removal_attempt = 0
        self.remove_retry_at: datetime | None = None
        self.paused_at: datetime | None = None
        self.resume_requested = False
        self.saved_ref: str | None = None
        self.disk_bytes: int | None = None

    # -- queries -------------------------------------------------------------------------------

    @property
    def public_status(self) -> EnvironmentStatus:
        if self.retire_at is not None and self.status in SETTLED_STATUSES:
            return EnvironmentStatus.RETIRING
        return self.status

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def takes_threads(self) -> bool:
        """A thread joining now gets a workspace: live, not failed, not cancelled."""
        return self.is_live and self.status != EnvironmentStatus.ERROR and not self.cancelled

    @property
    def can_give_up_path(self) -> bool:
        """Ready, idle and standing on a path it does not own: nothing is lost if it goes at once."""
        return (
            self.status == EnvironmentStatus.READY and not self.thread_ids and not self.owns_path and not self.cancelled
        )

    def setup_operation(self) -> str:
        return f"{self.id}.setup.{self.attempt}.{self.setup_attempt + 1}"

    def teardown_operation(self) -> str:
        return f"{self.id}.teardown"

    def awaits_hook(self, operation_id: str) -> bool:
        """The log started this hook operation and has not recorded its outcome: it may run."""
        return (operation_id, HookStatus.RUNNING) in (
            (self.setup_operation_id, self.setup_status),
            (self.teardown_operation_id, self.teardown_status),
        )

    def may_stop_hook(self, operation_id: str) -> bool:
        """Stopping the hook loses nothing the log still waits for: the environment was cancelled
        while its setup ran, or the outcome is already recorded. A teardown, once started, runs
        to its end (removal never waits on its success anyway)."""
        if not self.awaits_hook(operation_id):
            return True
        return operation_id == self.setup_operation_id and self.cancelled

    def hook_record(self, operation_id: str, kind: HookKind) -> RecordedHook:
        """What the log says of this environment's hook operation, as this state of it says it."""
        return RecordedHook(
            operation_id=operation_id,
            environment_id=str(self.id),
            kind=kind,
            host_id=self.host_id,
            workspace=self.path,
            awaited=self.awaits_hook(operation_id),
            stoppable=self.may_stop_hook(operation_id),
            environment_removed=self.status == EnvironmentStatus.REMOVED,
            slug=self.slug,
            ports=str(self.ports) if self.ports else None,
        )

    def current_hook(self, operation_id: str) -> RecordedHook | None:
        """What the log answers for this environment's current setup or teardown operation, read
        off this state: the same answer while it is the latest (as a command just left it). None
        for any other id, an earlier attempt's say, which only the log's index knows.

        The hook guard may start the hook on this answer after the log has moved on (HookGuard.to_run),
        since nothing it checks can have changed meanwhile: `awaited` goes from true to false only
        through the outcome (or skip) of this same operation, which only the provisioner's own step
        for the operation records, one step at a time per operation (the step that asks for the
        hook); host, path and kind never change once the operation started; a cancel (an archived
        thread, say) changes only `stoppable`, which the guard does not check before a start; a retry
        gets a new operation id, so an earlier attempt's operation is read from the log. A future
        event that ends an awaited hook another way (not through its own outcome) must revisit this.
        """
        if operation_id == self.setup_operation_id:
            return self.hook_record(operation_id, "setup")
        if operation_id == self.teardown_operation_id:
            return self.hook_record(operation_id, "teardown")
        return None

    def wants_removal(self, now: datetime) -> bool:
        """The environment should start removal now (cancelled, or its retire deadline passed)."""
        if self.status not in LIVE_STATUSES or self.thread_ids:
            return False
        return self.cancelled or (self.retire_at is not None and self.retire_at <= now)

    # -- what comes next ----------------------------------------------------------------------

    def next_step(self, now: datetime, transient_retry_delay: timedelta = TRANSIENT_RETRY_DELAY) -> Step:
        """The one thing to do next for this environment at `now` (see domain.steps)."""
        match self.status:
            case EnvironmentStatus.CREATING:
                return StopCreate(self.attempt) if self.cancelled else RunCreate(self.attempt)
            case EnvironmentStatus.PROVISIONING:
                return self._next_setup_step()
            case EnvironmentStatus.READY | EnvironmentStatus.ERROR:
                return self._next_settled_step(now, transient_retry_delay)
            case EnvironmentStatus.REMOVING:
                return self._next_removal_step(now)
        return Settled()

    def _next_setup_step(self) -> Step:
        if self.setup_status == HookStatus.RUNNING:
            assert self.setup_operation_id is not None
            return CancelSetup(self.setup_operation_id) if self.cancelled else RunSetup(self.setup_operation_id)
        if self.cancelled:
            return StartRemoval()
        if self.binding:
            return BindMember()
        if self.setup_status is None:
            # Whether a script exists is for the host to tell, where the workspace is (or for the
            # provider that has just made it empty: see Environments.record_created).
            return StartSetup() if self.owns_path else SkipSetup("the provider does not own the path")
        return Settled()

    def _next_settled_step(self, now: datetime, transient_retry_delay: timedelta) -> Step:
        if self.wants_removal(now):
            return StartRemoval()
        if self.needs_attempt_cleanup:
            return CleanAttempt(self.attempt)
        if self.retries_automatically(TRANSIENT_RETRIES):
            due = self.modified_on + transient_retry_delay
            return WakeAt(due) if due > now else RetryTransient(self.attempt)
        if self.retire_at is not None and not self.thread_ids:
            return WakeAt(self.retire_at)
        if self.status == EnvironmentStatus.READY:
            if self.paused_at is None:
                return PauseWhenIdle(self.modified_on)
            return Resume() if self.resume_requested else ResumeOnActivity(self.paused_at)
        return Settled()

    def _next_removal_step(self, now: datetime) -> Step:
        if self.teardown_status is None:
            return StartTeardown() if self.owns_path and self.path else SkipTeardown("no teardown to run")
        if self.teardown_status == HookStatus.RUNNING:
            assert self.teardown_operation_id is not None
            return RunTeardown(self.teardown_operation_id)
        if self.remove_retry_at is not None:
            return RetryRemoval(self.removal_attempt) if self.remove_retry_at <= now else WakeAt(self.remove_retry_at)
        return Remove(self.removal_attempt)

    # -- the create step -----------------------------------------------------------------------

    def may_plan(self, attempt: int) -> bool:
        """The host's plan of this attempt is still to be recorded."""
        return not self.planned and attempt == self.attempt and self.status == EnvironmentStatus.CREATING

    def record_planned(
        self,
        attempt: int,
        project_path: str | None,
        inputs: Any,
        claimed_path: str | None,
        ports: PortBlock | None = None,
    ) -> bool:
        """The host's plan of an environment placed while the host was away; the caller claims
        `claimed_path` and leases `ports` (probed on the host as it planned) in the same save."""
        if not self.may_plan(attempt):
            return False
        self._planned(project_path, inputs, claimed_path, **({"ports": ports.recorded()} if ports else {}))
        return True

    @event("Planned")
    def _planned(
        self, project_path: str | None, inputs: Any, claimed_path: str | None, ports: dict[str, int] | None = None
    ) -> None:
        self.project_path = project_path
        self.inputs = inputs
        self.claimed_path = claimed_path
        self.ports = PortBlock.from_recorded(ports) or self.ports
        self.planned = True
        self.status_message = None

    def note_host_awaited(self, message: str) -> bool:
        """The environment's next step waits for its host's agent: its status says so, once."""
        if self.status == EnvironmentStatus.REMOVED or self.status_message == message:
            return False
        self._host_awaited(message)
        return True

    @event("HostAwaited")
    def _host_awaited(self, message: str) -> None:
        self.status_message = message

    def record_created(
        self, attempt: int, path: str, owns_path: bool, merge_base_branch: str | None, resource: dict[str, Any] | None
    ) -> bool:
        if attempt != self.attempt or self.status != EnvironmentStatus.CREATING:
            return False
        self._created(attempt, path, owns_path, merge_base_branch, resource)
        return True

    def record_create_failed(self, attempt: int, failure: CreateFailure, message: str) -> bool:
        if attempt != self.attempt or self.status != EnvironmentStatus.CREATING:
            return False
        self._create_failed(attempt, failure, message)
        return True

    @event("Created")
    def _created(
        self, attempt: int, path: str, owns_path: bool, merge_base_branch: str | None, resource: dict[str, Any] | None
    ) -> None:
        self.status = EnvironmentStatus.PROVISIONING
        self.status_message = None
        self.path = path
        self.owns_path = owns_path
        self.merge_base_branch = merge_base_branch
        self.resource = resource
        self.disk_bytes = None  # a new workspace, not measured yet

    @event("CreateFailed")
    def _create_failed(self, attempt: int, failure: CreateFailure, message: str) -> None:
        self.status = EnvironmentStatus.ERROR
        self.status_message = message
        self.failure = failure
        if failure == "transient":
            self.transient_failures += 1

    @property
    def needs_attempt_cleanup(self) -> bool:
        """A failed create may have left something under its path key: remove it before a retry."""
        return self.status == EnvironmentStatus.ERROR and self.path is None and self.cleaned_attempt < self.attempt

    def record_attempt_cleaned(self, attempt: int) -> bool:
        if attempt != self.attempt or not self.needs_attempt_cleanup:
            return False
        self._attempt_cleaned(attempt)
        return True

    @event("AttemptCleaned")
    def _attempt_cleaned(self, attempt: int) -> None:
        self.cleaned_attempt = attempt

    @property
    def failed_for_good(self) -> bool:
        """Failed, and not about to try again by itself (a transient create failure with retries
        left, in a thread still waiting, is cleaned up and tried again)."""
        return self.status == EnvironmentStatus.ERROR and not (
            self.failure == "transient"
            and self.transient_failures <= TRANSIENT_RETRIES
            and not self.cancelled
            and bool(self.thread_ids)
        )

    def retries_automatically(self, limit: int) -> bool:
        """A transient create failure, cleaned up, with retries left, in a thread still waiting."""
        return (
            self.status == EnvironmentStatus.ERROR
            and self.path is None
            and self.failure == "transient"
            and self.transient_failures <= limit
            and self.cleaned_attempt == self.attempt
            and not self.cancelled
            and bool(self.thread_ids)
        )

    # -- the setup hook ------------------------------------------------------------------------

    def start_setup(self, operation_id: str) -> bool:
        if self.status != EnvironmentStatus.PROVISIONING or self.setup_status is not None or self.cancelled:
            return False
        if not self.owns_path:
            raise IllegalTransition("setup runs only in a workspace the provider owns")
        self._setup_started(operation_id)
        return True

    def skip_setup(self, reason: str) -> bool:
        """No setup to run (not an owned path, or no script): the environment is ready at once."""
        if self.status != EnvironmentStatus.PROVISIONING or self.setup_status is not None or self.cancelled:
            return False
        self._setup_skipped(reason)
        self._settle()
        return True

    def record_setup_outcome(self, operation_id: str, succeeded: bool, message: str | None) -> bool:
        if operation_id != self.setup_operation_id or self.setup_status != HookStatus.RUNNING:
            return False
        if succeeded:
            self._setup_succeeded(operation_id)
            if not self.cancelled:
                self._settle()
        else:
            self._setup_failed(operation_id, message or "setup failed")
        return True

    def record_setup_skipped(self, operation_id: str, reason: str) -> bool:
        """The host found no setup script for the started operation: the environment is ready,
        unless it was cancelled meanwhile."""
        if operation_id != self.setup_operation_id or self.setup_status != HookStatus.RUNNING:
            return False
        self._setup_skipped(reason)
        if not self.cancelled:
            self._settle()
        return True

    @event("SetupStarted")
    def _setup_started(self, operation_id: str) -> None:
        self.setup_status = HookStatus.RUNNING
        self.setup_operation_id = operation_id
        self.setup_attempt += 1
        self.status_message = "Running .bb-env-setup.sh"

    @event("SetupSkipped")
    def _setup_skipped(self, reason: str) -> None:
        self.setup_status = HookStatus.SKIPPED

    @event("SetupSucceeded")
    def _setup_succeeded(self, operation_id: str) -> None:
        self.setup_status = HookStatus.SUCCEEDED
        self.status_message = None

    @event("SetupFailed")
    def _setup_failed(self, operation_id: str, message: str) -> None:
        self.setup_status = HookStatus.FAILED
        self.status = EnvironmentStatus.ERROR
        self.status_message = message

    def _settle(self) -> None:
        """Prepared: ready for its threads, or, a pool's member with none, ready to be bound."""
        if self.pool_id is not None and not self.thread_ids and not self.binding:
            self._pooled()
        else:
            self._ready()

    @event("Ready")
    def _ready(self) -> None:
        self.status = EnvironmentStatus.READY
        self.status_message = None
        self.binding = False

    @event("Pooled")
    def _pooled(self) -> None:
        self.status = EnvironmentStatus.READY
        self.status_message = None

    # -- a pool's member (domain/pool.py) --------------------------------------------------------

    @property
    def bound(self) -> bool:
        """A pool's member that a thread took (ever): never bound again."""
        return self.pool_id is not None and self.origin_thread_id != ""

    @property
    def pooled(self) -> bool:
        """A pool's member ready to be bound now."""
        return (
            self.pool_id is not None
            and not self.bound
            and self.status == EnvironmentStatus.READY
            and not self.cancelled
            and self.retire_at is None
        )

    def prepared_on(self, base_commit: str, setup_hash: str | None) -> bool:
        return (self.base_commit, self.setup_hash) == (base_commit, setup_hash)

    def bind(self, thread_id: str, inputs: Any, thread_path_key: str) -> None:
        """The thread takes this ready member: its id, path, claim and leases stay; its workspace
        is renamed for the thread (BindMember), then it is ready for it."""
        if not self.pooled:
            raise IllegalTransition(f"environment {self.id} is no ready member of a pool")
        self._bound(thread_id, self.pool_id, inputs, thread_path_key)

    def record_bound(self, resource: dict[str, Any] | None) -> bool:
        """The provider renamed the workspace for its thread: it is ready."""
        if not self.binding or self.cancelled or self.status != EnvironmentStatus.PROVISIONING:
            return False
        if resource != self.resource:
            self._resource_recorded(resource)
        self._ready()
        return True

    def record_bind_failed(self, message: str) -> bool:
        """The rename failed: the thread leaves (for a cold environment of its own) and the member
        is removed, never bound again."""
        if not self.binding or self.cancelled:
            return False
        thread_id = self.origin_thread_id
        self._thread_detached(thread_id)
        self._cancelled(f"could not bind the pool's member to thread {thread_id}: {message}")
        return True

    @event("Bound")
    def _bound(self, thread_id: str, pool_id: str | None, inputs: Any, thread_path_key: str) -> None:
        """`thread_path_key`: what the thread's own workspace would be keyed by (its branch's
        name, for git-worktree's default branch); the member keeps its path key and path."""
        self.origin_thread_id = thread_id
        self.thread_path_key = thread_path_key
        self.inputs = inputs
        self.thread_ids.append(thread_id)
        self.joined_at[thread_id] = self.version + 1
        self.status = EnvironmentStatus.PROVISIONING
        self.status_message = "Binding the pool's member to the thread"
        self.binding = True

    # -- idle pause (providers that can suspend a resource, like a cloud sandbox) ---------------

    def record_resource(self, resource: dict[str, Any] | None) -> bool:
        """The provider's private handle changed (a pause checkpoint, say): keep the newest."""
        if not self.is_live or resource == self.resource:
            return False
        self._resource_recorded(resource)
        return True

    def record_paused(self, resource: dict[str, Any] | None, now: datetime) -> bool:
        if self.status != EnvironmentStatus.READY or self.paused_at is not None:
            return False
        self._paused(resource, now)
        return True

    def request_resume(self) -> bool:
        """A thread's message came while paused: the log asks for the resume, so that whichever
        replica drives the environment, now or after a failover or a restart, resumes it."""
        if self.paused_at is None or not self.is_live or self.resume_requested:
            return False
        self._resume_requested()
        return True

    def record_resumed(self, resource: dict[str, Any] | None) -> bool:
        if self.paused_at is None or not self.is_live:
            return False
        self._resumed(resource)
        return True

    @event("ResourceRecorded")
    def _resource_recorded(self, resource: dict[str, Any] | None) -> None:
        self.resource = resource

    @event("Paused")
    def _paused(self, resource: dict[str, Any] | None, paused_at: datetime) -> None:
        self.resource = resource
        self.paused_at = paused_at

    @event("ResumeRequested")
    def _resume_requested(self) -> None:
        self.resume_requested = True

    @event("Resumed")
    def _resumed(self, resource: dict[str, Any] | None) -> None:
        self.resource = resource
        self.paused_at = None
        self.resume_requested = False

    # -- a workspace found gone (bb doctor) ------------------------------------------------------

    @property
    def workspace_may_vanish(self) -> bool:
        """Settled on a workspace: one found gone now puts it in error (while it is prepared or
        removed, its own step fails or ends without it)."""
        return self.status in SETTLED_STATUSES and self.path is not None

    def record_workspace_vanished(self, path: str) -> bool:
        """The workspace at `path` is gone from its host: the environment is in error, without a
        workspace, so that a retry creates one again. Recorded once: the path is forgotten."""
        if not self.workspace_may_vanish or path != self.path:
            return False
        self._workspace_vanished(path, f"the workspace {path} vanished; `bb environment retry` creates it again")
        return True

    @event("WorkspaceVanished")
    def _workspace_vanished(self, path: str, message: str) -> None:
        self.status = EnvironmentStatus.ERROR
        self.status_message = message
        self.path = None
        self.disk_bytes = None
        self.failure = None
        self.setup_status = None  # the next workspace is a new one, whose setup has not run

    # -- the workspace's size on disk -------------------------------------------------------------

    @property
    def disk_measurable(self) -> bool:
        """Settled on a workspace that is there to measure (not paused: a paused one's resource is
        suspended, and its idle clock is its last event's time)."""
        return self.status in SETTLED_STATUSES and self.path is not None and self.paused_at is None

    def record_disk_usage(self, path: str, disk_bytes: int) -> bool:
        """The workspace at `path` takes `disk_bytes` now: recorded when it is worth it
        (domain/disk.py), so the log grows with the changes in size, never with the number of scans."""
        if not self.disk_measurable or path != self.path or disk_bytes < 0:
            return False
        if not worth_recording(self.disk_bytes, disk_bytes):
            return False
        self._disk_measured(disk_bytes)
        return True

    @event("DiskMeasured")
    def _disk_measured(self, disk_bytes: int) -> None:
        self.disk_bytes = disk_bytes

    # -- explicit retry ------------------------------------------------------------------------

    def retry(self, path_key: str, claimed_path: str | None) -> None:
        """Start the next create attempt (on `path_key`), or re-run a failed setup in place."""
        if self.status != EnvironmentStatus.ERROR or self.cancelled or self.retire_at is not None:
            raise IllegalTransition(f"only an environment in error can be retried; this one is {self.public_status}")
        if self.path is not None:
            self._setup_retried()
        elif self.needs_attempt_cleanup:
            raise IllegalTransition("the failed attempt is still being cleaned up; retry in a moment")
        else:
            self._create_retried(self.attempt + 1, path_key, claimed_path)

    @event("CreateRetried")
    def _create_retried(self, attempt: int, path_key: str, claimed_path: str | None) -> None:
        self.attempt = attempt
        self.path_key = path_key
        self.claimed_path = claimed_path
        self.status = EnvironmentStatus.CREATING
        self.status_message = None
        self.failure = None

    @event("SetupRetried")
    def _setup_retried(self) -> None:
        self.status = EnvironmentStatus.PROVISIONING
        self.setup_status = None
        self.status_message = None

    # -- threads, retirement, cancellation -----------------------------------------------------

    def attach_thread(self, thread_id: str) -> bool:
        if not self.is_live or self.cancelled:
            raise IllegalTransition(f"environment {self.id} is {self.public_status}; it takes no new threads")
        if thread_id in self.thread_ids:
            return False
        self._thread_attached(thread_id)
        if self.retire_at is not None:
            self._retire_cancelled()
        return True

    def detach_thread(self, thread_id: str, now: datetime, retire_grace_ms: int | None) -> bool:
        if thread_id not in self.thread_ids:
            return False
        self._thread_detached(thread_id)
        if self.thread_ids or not self.is_live:
            return True
        if self.status in PREPARING_STATUSES:
            self._cancelled("the last thread left while the environment was being prepared")
        elif retire_grace_ms is not None:
            self._retire_scheduled(now + timedelta(milliseconds=retire_grace_ms))
        return True

    def cancel_for_thread(self, thread_id: str) -> bool:
        """A thread's message was cancelled: stop preparing if nobody else waits for it."""
        if thread_id not in self.thread_ids or self.status not in PREPARING_STATUSES:
            return False
        if self.cancelled or len(self.thread_ids) > 1:
            return False
        self._thread_detached(thread_id)
        self._cancelled("the thread's message was cancelled while the environment was being prepared")
        return True

    def give_up_path(self) -> None:
        """Start removal now, so a new environment can take the path (see `can_give_up_path`)."""
        if not self.can_give_up_path:
            raise IllegalTransition(f"environment {self.id} is {self.public_status} and cannot give up its path")
        self._removal_started(self.removal_attempt + 1)

    def request_deletion(self) -> None:
        if self.thread_ids:
            raise ThreadsStillLive(
                f"environment {self.id} still serves threads {', '.join(self.thread_ids)}; archive them first"
            )
        if not self.is_live:
            return  # being removed, or removed: what a deletion asks for is done or under way (a repeat changes nothing)
        if self.status in PREPARING_STATUSES:
            if not self.cancelled:
                self._cancelled("deleted while being prepared")
        elif self.retire_at != self._origin_of_time():
            # Also when it is retiring already: a deletion does not wait out the grace (SPEC §3).
            self._retire_scheduled(self._origin_of_time())

    def _origin_of_time(self) -> datetime:
        # A deadline that has always passed: deletion skips the grace period.
        return datetime.fromtimestamp(0, tz=self.created_on.tzinfo)

    @event("ThreadAttached")
    def _thread_attached(self, thread_id: str) -> None:
        self.thread_ids.append(thread_id)
        self.joined_at[thread_id] = self.version + 1  # the version is this event's once it is applied

    @event("ThreadDetached")
    def _thread_detached(self, thread_id: str) -> None:
        self.thread_ids.remove(thread_id)
        del self.joined_at[thread_id]

    @event("RetireScheduled")
    def _retire_scheduled(self, retire_at: datetime) -> None:
        self.retire_at = retire_at

    @event("RetireCancelled")
    def _retire_cancelled(self) -> None:
        self.retire_at = None

    @event("Cancelled")
    def _cancelled(self, reason: str) -> None:
        self.cancelled = True
        self.status_message = reason

    # -- removal -------------------------------------------------------------------------------

    def start_removal(self, now: datetime) -> bool:
        if not self.wants_removal(now):
            return False
        self._removal_started(self.removal_attempt + 1)
        return True

    def start_teardown(self, operation_id: str) -> bool:
        if self.status != EnvironmentStatus.REMOVING or self.teardown_status is not None:
            return False
        if not (self.owns_path and self.path):
            raise IllegalTransition("teardown runs only in a workspace the provider owns")
        self._teardown_started(operation_id)
        return True

    def skip_teardown(self, reason: str) -> bool:
        if self.status != EnvironmentStatus.REMOVING or self.teardown_status is not None:
            return False
        self._teardown_skipped(reason)
        return True

    def record_teardown_outcome(self, operation_id: str, outcome: str, message: str | None) -> bool:
        if operation_id != self.teardown_operation_id or self.teardown_status != HookStatus.RUNNING:
            return False
        self._teardown_finished(operation_id, outcome, message)
        return True

    def record_teardown_skipped(self, operation_id: str, reason: str) -> bool:
        """The host found no teardown script for the started operation."""
        if operation_id != self.teardown_operation_id or self.teardown_status != HookStatus.RUNNING:
            return False
        self._teardown_skipped(reason)
        return True

    def record_removed(
        self, removal_attempt: int, saved_ref: str | None = None, not_saved: list[dict[str, Any]] | None = None
    ) -> bool:
        """`saved_ref`: where the provider saved the work that was only in the workspace, if any;
        `not_saved`: the files ({"path", "bytes"}) that save left out, deleted with the workspace."""
        if removal_attempt != self.removal_attempt or self.status != EnvironmentStatus.REMOVING:
            return False
        if saved_ref is not None:
            self._work_saved(saved_ref)
        self._removed(removal_attempt, not_saved or None)
        return True

    def record_remove_failed(self, removal_attempt: int, message: str, retry_at: datetime) -> bool:
        if removal_attempt != self.removal_attempt or self.status != EnvironmentStatus.REMOVING:
            return False
        self._remove_failed(removal_attempt, message, retry_at)
        return True

    def retry_removal(self, now: datetime) -> bool:
        if self.status != EnvironmentStatus.REMOVING or self.remove_retry_at is None or self.remove_retry_at > now:
            return False
        self._removal_started(self.removal_attempt + 1)
        return True

    @event("RemovalStarted")
    def _removal_started(self, removal_attempt: int) -> None:
        self.removal_attempt = removal_attempt
        self.status = EnvironmentStatus.REMOVING
        self.retire_at = None
        self.remove_retry_at = None
        self.status_message = None

    @event("TeardownStarted")
    def _teardown_started(self, operation_id: str) -> None:
        self.teardown_status = HookStatus.RUNNING
        self.teardown_operation_id = operation_id

    @event("TeardownSkipped")
    def _teardown_skipped(self, reason: str) -> None:
        self.teardown_status = HookStatus.SKIPPED

    @event("TeardownFinished")
    def _teardown_finished(self, operation_id: str, outcome: str, message: str | None) -> None:
        self.teardown_status = HookStatus.SUCCEEDED if outcome == HookStatus.SUCCEEDED else HookStatus.FAILED
        if message and outcome != HookStatus.SUCCEEDED:
            self.status_message = f"teardown: {message}"

    @event("WorkSaved")
    def _work_saved(self, saved_ref: str) -> None:
        self.saved_ref = saved_ref

    @event("Removed")
    def _removed(self, removal_attempt: int, not_saved: list[dict[str, Any]] | None = None) -> None:
        """`not_saved`: the files the saved work left out, None when none was (and absent from the
        events of releases before it, which saved every file)."""
        self.status = EnvironmentStatus.REMOVED
        self.path = None
        self.resource = None
        self.disk_bytes = None

    @event("RemoveFailed")
    def _remove_failed(self, removal_attempt: int, message: str, retry_at: datetime) -> None:
        self.status_message = message
        self.remove_retry_at = retry_at
