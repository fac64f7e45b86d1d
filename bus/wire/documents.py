"""The messages on the wire, as msgspec structs (camelCase JSON; each has `type` and `occurredAt`).

Stored event classes are not public. Each one is mapped to a stable document by `@publishes`, one
registry keyed by the domain event class: renaming a Python class never breaks a subscriber or an
old log, and an event without a document is found by a unit test, not by the relay. A document's
docstring says when it happens; `python -m bb_environments.entrypoints.catalog --write` makes docs/events.md, the JSON
Schemas and the AsyncAPI document from these structs.

The bytes of a document are part of the log's identity on the bus (the relay compares stream
messages to the store byte for byte): a field is never renamed or moved, and a new one is added
last, knowing that every stored event then reads differently once (the relay rewrites the stream).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar, Union
from uuid import UUID

import msgspec
from eventsourcing.domain import Aggregate, DomainEventProtocol

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.descriptions import said as _said
from bb_environments.domain.environment import Environment
from bb_environments.domain.host_claims import HostClaims
from bb_environments.domain.path_claim import PathClaim
from bb_environments.domain.registered_host import RegisteredHost
from bb_environments.domain.thread import Thread


class Document(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", omit_defaults=False):
    occurred_at: Annotated[datetime, msgspec.Meta(description="When the event was recorded (UTC).")]


# -- the registry: one public document per domain event class ---------------------------------------


@dataclass(frozen=True)
class Publication:
    """How one domain event class is published."""

    event: type[Aggregate.Event]
    document: type[Document]
    aggregate: type[Aggregate]
    kind: str
    """The aggregate's token in the log subject `bb.log.<kind>.<id>.<event>`."""
    from_aggregate: tuple[str, ...] = ()
    """Fields the document takes from the aggregate just after the event, not from the event."""

    @property
    def type(self) -> str:
        return type_tag(self.document)


@dataclass(frozen=True)
class _Owner:
    """What the documents of one aggregate's events share."""

    kind: str
    key: Callable[[Any, Any], str]
    common: Callable[[Any, Any], dict[str, Any]]


PUBLICATIONS: dict[type[Aggregate.Event], Publication] = {}
"""Every domain event class that is recorded, and its document (see `publishes`)."""

D = TypeVar("D", bound=type[Document])


def publishes(event: type[Aggregate.Event], *, from_aggregate: tuple[str, ...] = ()) -> Callable[[D], D]:
    """Declare the decorated struct the public document of the domain event class `event`."""

    def register(document: D) -> D:
        aggregate = next((a for a in _OWNERS if issubclass(event, a.Event)), None)
        if aggregate is None or event in PUBLICATIONS:
            raise TypeError(f"{event.__qualname__} is not an event of a published aggregate, or has a document already")
        type_tag(document)
        PUBLICATIONS[event] = Publication(event, document, aggregate, _OWNERS[aggregate].kind, from_aggregate)
        return document

    return register


def type_tag(struct: type[msgspec.Struct]) -> str:
    """A message's `type`: the tag of its struct, which every message on the wire has."""
    tag = struct.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{struct.__qualname__} has no string tag: a message's `type` is its tag")
    return tag


def document_for(event: DomainEventProtocol[UUID], aggregate: Any) -> tuple[str, Document]:
    """The public document and log subject of a stored event, given its aggregate just after it."""
    if not isinstance(event, Aggregate.Event) or type(event) not in PUBLICATIONS:
        raise LookupError(f"{type(event).__qualname__} has no public document: declare one with @publishes "
                          f"in bus/wire/documents.py")
    publication = PUBLICATIONS[type(event)]
    owner = _OWNERS[publication.aggregate]
    # What the event recorded, as far as the document declares it (msgspec drops the rest: a
    # provider's private `resource`, a thread's `intent`).
    fields = {_camel(k): (str(v) if isinstance(v, UUID) else v) for k, v in vars(event).items()
              if k not in ("originator_id", "originator_version", "timestamp")}
    fields |= {_camel(name): getattr(aggregate, name) for name in publication.from_aggregate}
    common = {"occurredAt": event.timestamp, "version": event.originator_version} | owner.common(event, aggregate)
    document = msgspec.convert(fields | common, publication.document, strict=False)
    key = owner.key(event, aggregate)
    return subjects.log_event(owner.kind, key, publication.type), document


@functools.cache  # an event's field names, a few dozen in all, at every document the relay publishes
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _claim_holder(event: Any, claim: PathClaim) -> str | None:
    holder = getattr(event, "environment_id", claim.holder)
    return str(holder) if holder else None


_OWNERS: dict[type[Aggregate], _Owner] = {
    Environment: _Owner(
        "environment", key=lambda event, _: str(event.originator_id),
        common=lambda event, environment: {
            "environmentId": str(event.originator_id), "threadIds": list(environment.thread_ids),
            "status": environment.public_status, "statusMessage": environment.status_message,
        },
    ),
    Thread: _Owner("thread", key=lambda _, thread: thread.thread_id,
                   common=lambda _, thread: {"threadId": thread.thread_id}),
    PathClaim: _Owner(
        "claim", key=lambda event, _: str(event.originator_id),
        common=lambda event, claim: {"claimId": str(event.originator_id), "hostId": claim.host_id,
                                     "path": claim.path, "environmentId": _claim_holder(event, claim)},
    ),
    HostClaims: _Owner("host", key=lambda _, host: host.host_id, common=lambda _, host: {"hostId": host.host_id}),
    RegisteredHost: _Owner("machine", key=lambda _, host: host.host_id, common=lambda _, host: {"hostId": host.host_id}),
}




# Fields that several documents share, each described once.
Attempt = Annotated[int, _said("The create attempt: 1, then one more per retry.")]
RemovalAttempt = Annotated[int, _said("The removal attempt: 1, then one more per retry.")]
OperationId = Annotated[str, _said("The hook operation: unique per run, and run at most once.")]
PathKey = Annotated[str, _said("The key under which the provider places this attempt's workspace.")]
ClaimedPath = Annotated[str | None, _said(
    "The path claimed (canonical form) before the provider runs, or null when none is claimed in advance.")]
Reason = Annotated[str, _said("Why, in one sentence.")]
Message = Annotated[str, _said("What went wrong, in one sentence.")]
ThreadId = Annotated[str, _said("The thread's id.")]


# -- environment events (bb.environments.<id>.<type>) ----------------------------------------------


class EnvironmentEvent(Document, kw_only=True):
    environment_id: Annotated[str, msgspec.Meta(description="The environment's id (a UUID).")]
    version: Annotated[int, msgspec.Meta(description=(
        "The environment's version after this event: 1 for `claimed`, then one more per event, gap-free."))]
    thread_ids: Annotated[list[str], msgspec.Meta(description="The live threads using the environment after this event.")]
    status: Annotated[str, msgspec.Meta(description=(
        "The environment's status after this event: creating, provisioning, ready, error, retiring, removing or removed."))]
    status_message: Annotated[str | None, msgspec.Meta(description=(
        "What to know about that status (an error, a running hook, a cancellation), or null."))] = None


@publishes(Environment.Claimed)
class Claimed(EnvironmentEvent, kw_only=True, tag="claimed"):
    """A thread's first message got a new environment: it is recorded together with the claim on its
    path (one transaction), before any provider touches the path. Status `creating`."""

    provider_id: Annotated[str, _said("The provider that creates the workspace (`git-worktree`, ...).")]
    host_id: Annotated[str, _said("The host the workspace is on.")]
    project_path: Annotated[str | None, _said("The project (a repository's root), or null.")]
    inputs: Annotated[Any, _said("The provider's inputs, as its inputs type reads them.")]
    path_key: PathKey
    claimed_path: ClaimedPath


@publishes(Environment.Planned)
class Planned(EnvironmentEvent, kw_only=True, tag="planned"):
    """The host's agent, away when the environment was claimed (its `claimedPath` was null then),
    planned it: the project and the path as that host resolves them, the path claimed in the same
    transaction, before the provider touches it. The create follows. Status `creating`."""

    project_path: Annotated[str | None, _said("The project as the host resolved it (canonical), or null.")]
    inputs: Annotated[Any, _said("The provider's inputs, as its inputs type reads them on the host.")]
    claimed_path: ClaimedPath


@publishes(Environment.HostAwaited)
class HostAwaited(EnvironmentEvent, kw_only=True, tag="host_awaited"):
    """The environment's next step waits for the agent of its host, which is offline or has not
    connected since it was registered: nothing is failed or released meanwhile, and the step goes
    on by itself once the agent is back. `statusMessage` (this `message`) names the host."""

    message: Message


@publishes(Environment.Created)
class Created(EnvironmentEvent, kw_only=True, tag="created"):
    """The provider created the workspace (create attempt `attempt`); `ownsPath` says whether the
    setup and teardown hooks may run in it. Status `provisioning`."""

    attempt: Attempt
    path: Annotated[str, _said("The workspace's path.")]
    owns_path: Annotated[bool, _said("Whether the provider made the workspace and removes it; only then do hooks run.")]
    merge_base_branch: Annotated[str | None, _said("The branch the work merges back into, if the provider says.")]


@publishes(Environment.CreateFailed)
class CreateFailed(EnvironmentEvent, kw_only=True, tag="create_failed"):
    """The provider's create attempt `attempt` failed. A `transient` failure is retried by itself (3
    times, after `attempt_cleaned`); a `terminal` one waits for `bb environment retry`. Status `error`."""

    attempt: Attempt
    failure: Annotated[str, _said("`transient` (retried by itself) or `terminal`.")]
    message: Message


@publishes(Environment.AttemptCleaned)
class AttemptCleaned(EnvironmentEvent, kw_only=True, tag="attempt_cleaned"):
    """What a failed create attempt may have left under its path key was removed; a retry may start."""

    attempt: Attempt


@publishes(Environment.CreateRetried)
class CreateRetried(EnvironmentEvent, kw_only=True, tag="create_retried"):
    """A failed create is tried again as attempt `attempt` on `pathKey` (`bb environment retry`, or
    by itself after a transient failure). Status `creating`."""

    attempt: Attempt
    path_key: PathKey
    claimed_path: ClaimedPath


@publishes(Environment.SetupStarted)
class SetupStarted(EnvironmentEvent, kw_only=True, tag="setup_started"):
    """The repository's `.bb-env-setup.sh` started in the workspace as hook operation `operationId`."""

    operation_id: OperationId


@publishes(Environment.SetupSkipped)
class SetupSkipped(EnvironmentEvent, kw_only=True, tag="setup_skipped"):
    """No setup runs (the provider does not own the workspace, made it empty, or the workspace has
    no `.bb-env-setup.sh`); `ready` follows in the same transaction."""

    reason: Reason


@publishes(Environment.SetupSucceeded)
class SetupSucceeded(EnvironmentEvent, kw_only=True, tag="setup_succeeded"):
    """The setup hook `operationId` succeeded; `ready` follows in the same transaction unless the
    environment was cancelled meanwhile."""

    operation_id: OperationId


@publishes(Environment.SetupFailed)
class SetupFailed(EnvironmentEvent, kw_only=True, tag="setup_failed"):
    """The setup hook `operationId` failed (`message` says how). Status `error`; `bb environment retry`
    runs the setup again in the same workspace."""

    operation_id: OperationId
    message: Message


@publishes(Environment.SetupRetried)
class SetupRetried(EnvironmentEvent, kw_only=True, tag="setup_retried"):
    """A failed setup will run again in the same workspace (`bb environment retry`). Status
    `provisioning`."""


@publishes(Environment.Ready, from_aggregate=("path",))
class Ready(EnvironmentEvent, kw_only=True, tag="ready"):
    """The environment is ready for its threads, at `path`. Status `ready`. A subscriber to
    `bb.environments.*.ready` hears each readiness once."""

    path: Annotated[str | None, _said("The workspace's path.")]


@publishes(Environment.ThreadAttached)
class ThreadAttached(EnvironmentEvent, kw_only=True, tag="thread_attached"):
    """Thread `threadId` joined the environment (sharing it, or unarchived); a retirement under way is
    cancelled (`retire_cancelled` follows)."""

    thread_id: ThreadId


@publishes(Environment.ThreadDetached)
class ThreadDetached(EnvironmentEvent, kw_only=True, tag="thread_detached"):
    """Thread `threadId` left the environment (archived, or its message cancelled)."""

    thread_id: ThreadId


@publishes(Environment.RetireScheduled)
class RetireScheduled(EnvironmentEvent, kw_only=True, tag="retire_scheduled"):
    """The environment's last live thread left: it is removed at `retireAt` unless a thread comes back
    (a deletion schedules a deadline that has passed). Status `retiring`."""

    retire_at: Annotated[datetime, _said("When removal starts unless a thread comes back.")]


@publishes(Environment.RetireCancelled)
class RetireCancelled(EnvironmentEvent, kw_only=True, tag="retire_cancelled"):
    """A thread came back before the retire deadline: the environment stays."""


@publishes(Environment.Cancelled)
class Cancelled(EnvironmentEvent, kw_only=True, tag="cancelled"):
    """The environment was cancelled while being prepared (`reason`: its last thread left, its
    thread's message was cancelled, or it was deleted); removal follows once no create runs."""

    reason: Reason


@publishes(Environment.RemovalStarted)
class RemovalStarted(EnvironmentEvent, kw_only=True, tag="removal_started"):
    """Removal attempt `removalAttempt` started (the retire deadline passed, a deletion, a
    cancellation, a retry after `remove_failed`, or an idle environment giving up its path).
    Status `removing`."""

    removal_attempt: RemovalAttempt


@publishes(Environment.TeardownStarted)
class TeardownStarted(EnvironmentEvent, kw_only=True, tag="teardown_started"):
    """The repository's `.bb-env-teardown.sh` started in the workspace as hook operation
    `operationId`."""

    operation_id: OperationId


@publishes(Environment.TeardownSkipped)
class TeardownSkipped(EnvironmentEvent, kw_only=True, tag="teardown_skipped"):
    """No teardown runs (the provider does not own the workspace, or the repository has no
    `.bb-env-teardown.sh`)."""

    reason: Reason


@publishes(Environment.TeardownFinished)
class TeardownFinished(EnvironmentEvent, kw_only=True, tag="teardown_finished"):
    """The teardown hook `operationId` ended with `outcome`; a failure is reported in `statusMessage`
    and does not block removal."""

    operation_id: OperationId
    outcome: Annotated[str, _said("`succeeded`, `failed`, `timed_out`, `cancelled` or `interrupted`.")]
    message: Annotated[str | None, _said("What went wrong, or null.")]


@publishes(Environment.ResourceRecorded)
class ResourceRecorded(EnvironmentEvent, kw_only=True, tag="resource_recorded"):
    """The provider's private handle of the workspace changed (kept in the log; the document does not
    carry it)."""


@publishes(Environment.Paused)
class Paused(EnvironmentEvent, kw_only=True, tag="paused"):
    """An idle environment of a provider that can suspend it (modal-sandbox) was paused at
    `pausedAt`; its status stays `ready`."""

    paused_at: Annotated[datetime, _said("When it was paused.")]


@publishes(Environment.Resumed)
class Resumed(EnvironmentEvent, kw_only=True, tag="resumed"):
    """A paused environment was resumed (a thread's message came)."""


@publishes(Environment.WorkSaved)
class WorkSaved(EnvironmentEvent, kw_only=True, tag="work_saved"):
    """Before the workspace was deleted, what existed only in it (uncommitted changes, commits on
    no other branch) was saved as one commit under `savedRef` in the project repository; `removed`
    follows in the same transaction. Status `removing`."""

    saved_ref: Annotated[str, _said(
        "The git ref holding the saved work (`refs/bb/saved/<environmentId>`): "
        "`git worktree add <dir> <savedRef>` gets it back.")]


@publishes(Environment.Removed)
class Removed(EnvironmentEvent, kw_only=True, tag="removed"):
    """The provider removed the workspace (removal attempt `removalAttempt`); the path claim is
    released in the same transaction. Status `removed`."""

    removal_attempt: RemovalAttempt


@publishes(Environment.RemoveFailed)
class RemoveFailed(EnvironmentEvent, kw_only=True, tag="remove_failed"):
    """Removal attempt `removalAttempt` failed (`message`); removal starts again at `retryAt` (60 s
    later), until it succeeds. Status `removing`."""

    removal_attempt: RemovalAttempt
    message: Message
    retry_at: Annotated[datetime, _said("When removal starts again.")]



@publishes(Environment.WorkspaceVanished)
class WorkspaceVanished(EnvironmentEvent, kw_only=True, tag="workspace_vanished"):
    """`bb doctor --fix` found the workspace at `path` gone from its host: the environment has no
    workspace now, and `bb environment retry` creates one again. Status `error`; `statusMessage`
    says so."""

    path: Annotated[str, _said("The workspace's path, which no longer exists.")]


# -- thread and claim facts (stored in the log; not re-published) ----------------------------------


class ThreadEvent(Document):
    thread_id: Annotated[str, msgspec.Meta(description="The thread's id, as its publisher named it.")]
    version: Annotated[int, msgspec.Meta(description="The thread's version after this event (gap-free).")]


@publishes(Thread.Registered)
class ThreadRegistered(ThreadEvent, kw_only=True, tag="thread_registered"):
    """A thread became known to the service (its `created` event, or `bb thread spawn`), with its
    project, parent and host."""

    project_path: Annotated[str | None, _said("The thread's project, or null.")]
    parent_thread_id: Annotated[str | None, _said("The thread's parent, or null.")]
    host_id: Annotated[str, _said("The host its environment runs on.")]


@publishes(Thread.EnvironmentAssigned)
class ThreadEnvironmentAssigned(ThreadEvent, kw_only=True, tag="thread_environment_assigned"):
    """The thread got environment `environmentId` (a new one, or one it joined)."""

    environment_id: Annotated[str, _said("The environment the thread uses now.")]


@publishes(Thread.EnvironmentRequested)
class ThreadEnvironmentRequested(ThreadEvent, kw_only=True, tag="thread_environment_requested"):
    """The thread's first message asked for an environment; recorded before one is given, so a crash
    cannot lose the request."""


@publishes(Thread.EnvironmentLeft)
class ThreadEnvironmentLeft(ThreadEvent, kw_only=True, tag="thread_environment_left"):
    """The thread no longer uses environment `environmentId` (its message was cancelled, or it was
    unarchived after the environment ended)."""

    environment_id: Annotated[str, _said("The environment the thread left.")]


@publishes(Thread.Refused)
class ThreadRefused(ThreadEvent, kw_only=True, tag="thread_refused"):
    """The thread's request for an environment was refused (`message`: a blocked provider, a claimed
    path, ...); `bb thread list` shows it as `refusal`."""

    message: Annotated[str, _said("Why the thread got no environment, in one sentence.")]


@publishes(Thread.Archived)
class ThreadArchived(ThreadEvent, kw_only=True, tag="thread_archived"):
    """The thread was archived; its environment retires once no live thread uses it."""


@publishes(Thread.Unarchived)
class ThreadUnarchived(ThreadEvent, kw_only=True, tag="thread_unarchived"):
    """The thread was unarchived; it rejoins its environment if that is still live."""


class ClaimEvent(Document):
    claim_id: Annotated[str, msgspec.Meta(description="The claim's id (a UUID derived from the host and the path).")]
    version: Annotated[int, msgspec.Meta(description="The claim's version after this event (gap-free).")]
    host_id: Annotated[str, msgspec.Meta(description="The host the path is on.")]
    path: Annotated[str, msgspec.Meta(description="The claimed path, in canonical form (symlinks resolved).")]
    environment_id: Annotated[str | None, msgspec.Meta(description="The environment taking or giving up the path.")]


@publishes(PathClaim.Taken)
class ClaimTaken(ClaimEvent, kw_only=True, tag="claim_taken"):
    """A path (its canonical form) on a host was claimed for environment `environmentId`, in the
    transaction of that environment's `claimed` (or of a retry on a new path)."""


@publishes(PathClaim.Retaken)
class ClaimRetaken(ClaimEvent, kw_only=True, tag="claim_retaken"):
    """A released path was claimed again, by environment `environmentId`."""


@publishes(PathClaim.Released)
class ClaimReleased(ClaimEvent, kw_only=True, tag="claim_released"):
    """Environment `environmentId` gave the path up: in the transaction of its `removed`, or of
    handing the path to the environment that replaces it."""


class HostClaimsEvent(Document):
    host_id: Annotated[str, msgspec.Meta(description="The host whose claims these are.")]
    version: Annotated[int, msgspec.Meta(description="The version of the host's claims after this event (gap-free).")]


@publishes(HostClaims.Started)
class HostClaimsStarted(HostClaimsEvent, kw_only=True, tag="host_claims_started"):
    """A store that several core replicas may write began to keep the host's live claims together,
    so that the claims on one host are decided one at a time: in the transaction of the first claim
    taken or released there, holding the claims live until then."""

    held: Annotated[dict[str, UUID], msgspec.Meta(
        description="Each path (canonical form) held on the host until then, with the environment holding it.")]


@publishes(HostClaims.Held)
class HostClaimsHeld(HostClaimsEvent, kw_only=True, tag="host_claims_held"):
    """Environment `environmentId` holds the path on the host now: in the transaction of its
    `claim_taken` or `claim_retaken` (on a store that several core replicas may write)."""

    path: Annotated[str, msgspec.Meta(description="The claimed path, in canonical form (symlinks resolved).")]
    environment_id: Annotated[str, msgspec.Meta(description="The environment holding the path.")]


@publishes(HostClaims.Released)
class HostClaimsReleased(HostClaimsEvent, kw_only=True, tag="host_claims_released"):
    """Environment `environmentId` no longer holds the path on the host: in the transaction of its
    `claim_released` (on a store that several core replicas may write)."""

    path: Annotated[str, msgspec.Meta(description="The released path, in canonical form (symlinks resolved).")]
    environment_id: Annotated[str, msgspec.Meta(description="The environment that held the path.")]



class RegisteredHostEvent(Document):
    host_id: Annotated[str, msgspec.Meta(description="The registered host's id.")]
    version: Annotated[int, msgspec.Meta(description="The version of the host's registration after this event (gap-free).")]


AgentPublicKey = Annotated[str, _said(
    "The public NKEY of the seed the host's agent connects with (the seed itself is never recorded).")]


@publishes(RegisteredHost.Registered)
class HostRegistered(RegisteredHostEvent, kw_only=True, tag="host_registered"):
    """`bb machine register` registered the host: environments may be placed on it, and its agent
    connects with the seed of `publicKey`. Also recorded when a service starts on a data dir whose
    seed file of a host the log does not know was made by an earlier release."""

    public_key: AgentPublicKey


@publishes(RegisteredHost.CredentialsRotated)
class HostCredentialsRotated(RegisteredHostEvent, kw_only=True, tag="host_credentials_rotated"):
    """`bb machine register --rotate` replaced the seed of the host's agent: the old one is refused."""

    public_key: AgentPublicKey


@publishes(RegisteredHost.Removed)
class HostRemoved(RegisteredHostEvent, kw_only=True, tag="host_removed"):
    """`bb machine remove` removed the host, which no environment that is not removed lived on: its
    seed is refused, and nothing may be placed on it until it is registered again."""


@publishes(RegisteredHost.RegisteredAgain)
class HostRegisteredAgain(RegisteredHostEvent, kw_only=True, tag="host_registered_again"):
    """`bb machine register` registered a removed host again, with a new seed."""

    public_key: AgentPublicKey


LogDocument = Union[tuple(dict.fromkeys(p.document for p in PUBLICATIONS.values()))]  # type: ignore[valid-type]
"""Any document of the log (`bb.log.>`, `bb events export`)."""
log_decoder = msgspec.json.Decoder(LogDocument)
