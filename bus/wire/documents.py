"""The log's documents on the wire, as msgspec structs (camelCase JSON; each has `type` and `occurredAt`):
the base every document shares, the fields several share, and the environment events. The thread,
claim and host facts, kept in the log only, are in bus/wire/log_only_documents.py.

Stored event classes are not public: each is published as one of these documents, as the table in
bus/core/publications.py says. These modules are wire only (no event library, no aggregate), so a
client reads the documents without loading the service. A document's docstring says when it
happens; `python -m bb_environments.entrypoints.catalog --write` makes docs/events.md, the JSON
Schemas and the AsyncAPI document from these structs.

Each document's class is called after its `type` with `Document` added (`created`: `CreatedDocument`),
which tells it from the aggregate's event (`Environment.Created`) and the provider's result
(`providers.contract.Created`); the catalog names its schema after the `type` alone.

The bytes of a document are part of the log's identity on the bus (the relay compares stream
messages to the store byte for byte): a field is never renamed or moved, and a new one is added
last, knowing that every stored event then reads differently once (the relay rewrites the stream).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Union

import msgspec

from bb_environments.bus.wire.descriptions import said as _said


class Document(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", omit_defaults=False):
    occurred_at: Annotated[datetime, msgspec.Meta(description="When the event was recorded (UTC).")]

    @property
    def type(self) -> str:
        """Its `type` on the wire (docs/events.md)."""
        return type_tag(type(self))


def type_tag(struct: type[msgspec.Struct]) -> str:
    """A message's `type`: the tag of its struct, which every message on the wire has."""
    tag = struct.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{struct.__qualname__} has no string tag: a message's `type` is its tag")
    return tag


# Fields that several documents share, each described once.
Attempt = Annotated[int, _said("The create attempt: 1, then one more per retry.")]
RemovalAttempt = Annotated[int, _said("The removal attempt: 1, then one more per retry.")]
OperationId = Annotated[str, _said("The hook operation: unique per run, and run at most once.")]
PathKey = Annotated[str, _said("The key under which the provider places this attempt's workspace.")]
ClaimedPath = Annotated[
    str | None,
    _said("The path claimed (canonical form) before the provider runs, or null when none is claimed in advance."),
]
Reason = Annotated[str, _said("Why, in one sentence.")]


class Ports(msgspec.Struct, frozen=True):
    """A block of `count` consecutive TCP ports from `first`, leased on the environment's host."""

    first: Annotated[int, msgspec.Meta(description="The block's first port (the hooks' `BB_PORT`).")]
    count: Annotated[int, msgspec.Meta(description="How many ports it holds (BB_PORTS_PER_ENVIRONMENT when leased).")]


Slug = Annotated[
    str | None,
    _said(
        "The environment's name, unique among the live environments of its host (at most 40 characters of "
        "`[a-z0-9-]`, starting with a letter); left out by a release before slugs."
    ),
]
LeasedPorts = Annotated[
    Ports | None,
    _said(
        "The block of ports leased to the environment on its host, or null: none yet (placed while its host's "
        "agent was away: leased when it is planned); left out by a release before leases."
    ),
]
# Fields added to documents a release before recorded without them are left out of those (UNSET), so
# that a stored event keeps its bytes on the bus (see the module's docstring).
Message = Annotated[str, _said("What went wrong, in one sentence.")]
ThreadId = Annotated[str, _said("The thread's id.")]


# -- environment events (bb.environments.<id>.<type>) ----------------------------------------------


class EnvironmentEvent(Document, kw_only=True):
    environment_id: Annotated[str, msgspec.Meta(description="The environment's id (a UUID).")]
    version: Annotated[
        int,
        msgspec.Meta(
            description=(
                "The environment's version after this event: 1 for `claimed`, then one more per event, gap-free."
            )
        ),
    ]
    thread_ids: Annotated[
        list[str], msgspec.Meta(description="The live threads using the environment after this event.")
    ]
    status: Annotated[
        str,
        msgspec.Meta(
            description=(
                "The environment's status after this event: creating, provisioning, ready, error, retiring, removing or removed."
            )
        ),
    ]
    status_message: Annotated[
        str | None,
        msgspec.Meta(
            description=("What to know about that status (an error, a running hook, a cancellation), or null.")
        ),
    ] = None


class ClaimedDocument(EnvironmentEvent, kw_only=True, tag="claimed"):
    """A thread's first message got a new environment: it is recorded together with the claim on its
    path (one transaction), before any provider touches the path. Status `creating`."""

    provider_id: Annotated[str, _said("The provider that creates the workspace (`git-worktree`, ...).")]
    host_id: Annotated[str, _said("The host the workspace is on.")]
    project_path: Annotated[str | None, _said("The project (a repository's root), or null.")]
    inputs: Annotated[Any, _said("The provider's inputs, as its inputs type reads them.")]
    path_key: PathKey
    claimed_path: ClaimedPath
    slug: Slug | msgspec.UnsetType = msgspec.UNSET
    ports: LeasedPorts | msgspec.UnsetType = msgspec.UNSET
    pool_id: Annotated[
        str | msgspec.UnsetType,
        _said(
            "Present only for a warm pool's member, claimed by no thread (`threadIds` empty): the pool's id "
            "(`bb pool list`). It is bound to a thread later (`bound`)."
        ),
    ] = msgspec.UNSET


class PlannedDocument(EnvironmentEvent, kw_only=True, tag="planned"):
    """The host's agent, away when the environment was claimed (its `claimedPath` was null then),
    planned it: the project and the path as that host resolves them, the path claimed in the same
    transaction, before the provider touches it. The create follows. Status `creating`."""

    project_path: Annotated[str | None, _said("The project as the host resolved it (canonical), or null.")]
    inputs: Annotated[Any, _said("The provider's inputs, as its inputs type reads them on the host.")]
    claimed_path: ClaimedPath
    ports: LeasedPorts | msgspec.UnsetType = msgspec.UNSET


class HostAwaitedDocument(EnvironmentEvent, kw_only=True, tag="host_awaited"):
    """The environment's next step waits for the agent of its host, which is offline or has not
    connected since it was registered: nothing is failed or released meanwhile, and the step goes
    on by itself once the agent is back. `statusMessage` (this `message`) names the host."""

    message: Message


class CreatedDocument(EnvironmentEvent, kw_only=True, tag="created"):
    """The provider created the workspace (create attempt `attempt`); `ownsPath` says whether the
    setup and teardown hooks may run in it. Status `provisioning`."""

    attempt: Attempt
    path: Annotated[str, _said("The workspace's path.")]
    owns_path: Annotated[bool, _said("Whether the provider made the workspace and removes it; only then do hooks run.")]
    merge_base_branch: Annotated[str | None, _said("The branch the work merges back into, if the provider says.")]


class CreateFailedDocument(EnvironmentEvent, kw_only=True, tag="create_failed"):
    """The provider's create attempt `attempt` failed. A `transient` failure is retried by itself (3
    times, after `attempt_cleaned`); a `terminal` one waits for `bb environment retry`. Status `error`."""

    attempt: Attempt
    failure: Annotated[str, _said("`transient` (retried by itself) or `terminal`.")]
    message: Message


class AttemptCleanedDocument(EnvironmentEvent, kw_only=True, tag="attempt_cleaned"):
    """What a failed create attempt may have left under its path key was removed; a retry may start."""

    attempt: Attempt


class CreateRetriedDocument(EnvironmentEvent, kw_only=True, tag="create_retried"):
    """A failed create is tried again as attempt `attempt` on `pathKey` (`bb environment retry`, or
    by itself after a transient failure). Status `creating`."""

    attempt: Attempt
    path_key: PathKey
    claimed_path: ClaimedPath


class SetupStartedDocument(EnvironmentEvent, kw_only=True, tag="setup_started"):
    """The repository's `.bb-env-setup.sh` started in the workspace as hook operation `operationId`."""

    operation_id: OperationId


class SetupSkippedDocument(EnvironmentEvent, kw_only=True, tag="setup_skipped"):
    """No setup runs (the provider does not own the workspace, made it empty, or the workspace has
    no `.bb-env-setup.sh`); `ready` follows in the same transaction."""

    reason: Reason


class SetupSucceededDocument(EnvironmentEvent, kw_only=True, tag="setup_succeeded"):
    """The setup hook `operationId` succeeded; `ready` follows in the same transaction unless the
    environment was cancelled meanwhile."""

    operation_id: OperationId


class SetupFailedDocument(EnvironmentEvent, kw_only=True, tag="setup_failed"):
    """The setup hook `operationId` failed (`message` says how). Status `error`; `bb environment retry`
    runs the setup again in the same workspace."""

    operation_id: OperationId
    message: Message


class SetupRetriedDocument(EnvironmentEvent, kw_only=True, tag="setup_retried"):
    """A failed setup will run again in the same workspace (`bb environment retry`). Status
    `provisioning`."""


class ReadyDocument(EnvironmentEvent, kw_only=True, tag="ready"):
    """The environment is ready for its threads, at `path`. Status `ready`. A subscriber to
    `bb.environments.*.ready` hears each readiness once."""

    path: Annotated[str | None, _said("The workspace's path.")]


class PooledDocument(EnvironmentEvent, kw_only=True, tag="pooled"):
    """A warm pool's member is created and set up, with no thread: status `ready`, `threadIds` empty.
    Not `ready`, which says a thread's environment is ready: a member is ready for its thread only
    after `bound` and the `ready` that follows it."""

    pooled: Annotated[bool, _said("Always true: the environment waits in its pool for a thread.")] = True


class BoundDocument(EnvironmentEvent, kw_only=True, tag="bound"):
    """Thread `threadId`'s first message took this ready member of pool `poolId`, in the transaction
    of the thread's placement; the environment's id, path, claim, slug and ports stay. The provider
    gives the workspace the thread's identity (git-worktree: renames its branch to the thread's),
    then `ready` follows; no setup runs. Status `provisioning`. A member is bound once, ever."""

    thread_id: ThreadId
    pool_id: Annotated[str, _said("The pool the member was taken from.")]


class ThreadAttachedDocument(EnvironmentEvent, kw_only=True, tag="thread_attached"):
    """Thread `threadId` joined the environment (sharing it, or unarchived); a retirement under way is
    cancelled (`retire_cancelled` follows)."""

    thread_id: ThreadId


class ThreadDetachedDocument(EnvironmentEvent, kw_only=True, tag="thread_detached"):
    """Thread `threadId` left the environment (archived, or its message cancelled)."""

    thread_id: ThreadId


class RetireScheduledDocument(EnvironmentEvent, kw_only=True, tag="retire_scheduled"):
    """The environment's last live thread left: it is removed at `retireAt` unless a thread comes back
    (a deletion schedules a deadline that has passed). Status `retiring`."""

    retire_at: Annotated[datetime, _said("When removal starts unless a thread comes back.")]


class RetireCancelledDocument(EnvironmentEvent, kw_only=True, tag="retire_cancelled"):
    """A thread came back before the retire deadline: the environment stays."""


class CancelledDocument(EnvironmentEvent, kw_only=True, tag="cancelled"):
    """The environment was cancelled while being prepared (`reason`: its last thread left, its
    thread's message was cancelled, or it was deleted); removal follows once no create runs."""

    reason: Reason


class RemovalStartedDocument(EnvironmentEvent, kw_only=True, tag="removal_started"):
    """Removal attempt `removalAttempt` started (the retire deadline passed, a deletion, a
    cancellation, a retry after `remove_failed`, or an idle environment giving up its path).
    Status `removing`."""

    removal_attempt: RemovalAttempt


class TeardownStartedDocument(EnvironmentEvent, kw_only=True, tag="teardown_started"):
    """The repository's `.bb-env-teardown.sh` started in the workspace as hook operation
    `operationId`."""

    operation_id: OperationId


class TeardownSkippedDocument(EnvironmentEvent, kw_only=True, tag="teardown_skipped"):
    """No teardown runs (the provider does not own the workspace, or the repository has no
    `.bb-env-teardown.sh`)."""

    reason: Reason


class TeardownFinishedDocument(EnvironmentEvent, kw_only=True, tag="teardown_finished"):
    """The teardown hook `operationId` ended with `outcome`; a failure is reported in `statusMessage`
    and does not block removal."""

    operation_id: OperationId
    outcome: Annotated[str, _said("`succeeded`, `failed`, `timed_out`, `cancelled` or `interrupted`.")]
    message: Annotated[str | None, _said("What went wrong, or null.")]


class ResourceRecordedDocument(EnvironmentEvent, kw_only=True, tag="resource_recorded"):
    """The provider's private handle of the workspace changed (kept in the log; the document does not
    carry it)."""


class PausedDocument(EnvironmentEvent, kw_only=True, tag="paused"):
    """An idle environment of a provider that can suspend it (modal-sandbox) was paused at
    `pausedAt`; its status stays `ready`."""

    paused_at: Annotated[
        datetime, _said("When it was found idle and its pause began: a thread's message after it resumes it.")
    ]


class ResumeRequestedDocument(EnvironmentEvent, kw_only=True, tag="resume_requested"):
    """A thread's message came for the paused environment: whichever replica drives it, now or
    after a failover or a restart, resumes it (`resumed` follows)."""


class ResumedDocument(EnvironmentEvent, kw_only=True, tag="resumed"):
    """A paused environment was resumed (a thread's message came)."""


class WorkSavedDocument(EnvironmentEvent, kw_only=True, tag="work_saved"):
    """Before the workspace was deleted, what existed only in it (uncommitted changes, commits on
    no other branch) was saved as one commit under `savedRef` in the project repository; `removed`
    follows in the same transaction. Status `removing`."""

    saved_ref: Annotated[
        str,
        _said(
            "The git ref holding the saved work (`refs/bb/saved/<environmentId>`): "
            "`git worktree add <dir> <savedRef>` gets it back."
        ),
    ]


class NotSavedFile(msgspec.Struct, kw_only=True):
    path: Annotated[str, _said("The file, relative to the workspace.")]
    bytes: Annotated[int, _said("Its size.")]


class RemovedDocument(EnvironmentEvent, kw_only=True, tag="removed"):
    """The provider removed the workspace (removal attempt `removalAttempt`); the path claim is
    released in the same transaction. Status `removed`."""

    removal_attempt: RemovalAttempt
    not_saved: Annotated[
        list[NotSavedFile] | msgspec.UnsetType,
        _said(
            "Present only when the work saved before the removal (`work_saved`) left files out, each with its "
            "`path` (relative to the workspace) and `bytes`: those larger "
            "than BB_SAVED_WORK_MAX_BYTES (untracked, or tracked and changed), the largest 100 at most, "
            "largest first. They are in no saved ref: they were deleted with the workspace."
        ),
    ] = msgspec.UNSET


class RemoveFailedDocument(EnvironmentEvent, kw_only=True, tag="remove_failed"):
    """Removal attempt `removalAttempt` failed (`message`); removal starts again at `retryAt` (60 s
    later), until it succeeds. Status `removing`."""

    removal_attempt: RemovalAttempt
    message: Message
    retry_at: Annotated[datetime, _said("When removal starts again.")]


class WorkspaceVanishedDocument(EnvironmentEvent, kw_only=True, tag="workspace_vanished"):
    """`bb doctor --fix` found the workspace at `path` gone from its host: the environment has no
    workspace now, and `bb environment retry` creates one again. Status `error`; `statusMessage`
    says so."""

    path: Annotated[str, _said("The workspace's path, which no longer exists.")]


class DiskMeasuredDocument(EnvironmentEvent, kw_only=True, tag="disk_measured"):
    """The agent of its host measured the workspace as `du -sb` counts it (a moment after its setup
    settled, then at every scan, every BB_DISK_SCAN_INTERVAL_S), and the figure moved by more
    than 5% since the last one recorded (or is the first): the environment's `diskBytes`."""

    disk_bytes: Annotated[int, _said("The bytes the workspace takes.")]


EnvironmentDocument = Union[tuple(EnvironmentEvent.__subclasses__())]  # type: ignore[valid-type]  # noqa: UP007 (made from a tuple)
"""Any environment event (`bb.environments.<id>.<type>`, `bb.log.environment.>`)."""
