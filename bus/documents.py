"""The messages on the wire, as msgspec structs (camelCase JSON; each has `type` and `occurredAt`).

Stored event classes are not public: `document_for` maps each stored event to a stable document,
so renaming a Python class never breaks a subscriber or an old log.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from eventsourcing.domain import Aggregate

from bus import subjects


class Document(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", omit_defaults=False):
    occurred_at: datetime


# -- environment events (bb.environments.<id>.<type>) ----------------------------------------------


class EnvironmentEvent(Document, kw_only=True):
    environment_id: str
    version: int
    thread_ids: list[str]
    status: str
    status_message: str | None = None


class Claimed(EnvironmentEvent, kw_only=True, tag="claimed"):
    provider_id: str
    host_id: str
    project_path: str | None
    inputs: Any
    path_key: str
    claimed_path: str | None


class Created(EnvironmentEvent, kw_only=True, tag="created"):
    attempt: int
    path: str
    owns_path: bool
    merge_base_branch: str | None


class CreateFailed(EnvironmentEvent, kw_only=True, tag="create_failed"):
    attempt: int
    failure: str
    message: str


class AttemptCleaned(EnvironmentEvent, kw_only=True, tag="attempt_cleaned"):
    attempt: int


class CreateRetried(EnvironmentEvent, kw_only=True, tag="create_retried"):
    attempt: int
    path_key: str
    claimed_path: str | None


class SetupStarted(EnvironmentEvent, kw_only=True, tag="setup_started"):
    operation_id: str


class SetupSkipped(EnvironmentEvent, kw_only=True, tag="setup_skipped"):
    reason: str


class SetupSucceeded(EnvironmentEvent, kw_only=True, tag="setup_succeeded"):
    operation_id: str


class SetupFailed(EnvironmentEvent, kw_only=True, tag="setup_failed"):
    operation_id: str
    message: str


class SetupRetried(EnvironmentEvent, kw_only=True, tag="setup_retried"):
    pass


class Ready(EnvironmentEvent, kw_only=True, tag="ready"):
    path: str | None


class ThreadAttached(EnvironmentEvent, kw_only=True, tag="thread_attached"):
    thread_id: str


class ThreadDetached(EnvironmentEvent, kw_only=True, tag="thread_detached"):
    thread_id: str


class RetireScheduled(EnvironmentEvent, kw_only=True, tag="retire_scheduled"):
    retire_at: datetime


class RetireCancelled(EnvironmentEvent, kw_only=True, tag="retire_cancelled"):
    pass


class Cancelled(EnvironmentEvent, kw_only=True, tag="cancelled"):
    reason: str


class RemovalStarted(EnvironmentEvent, kw_only=True, tag="removal_started"):
    removal_attempt: int


class TeardownStarted(EnvironmentEvent, kw_only=True, tag="teardown_started"):
    operation_id: str


class TeardownSkipped(EnvironmentEvent, kw_only=True, tag="teardown_skipped"):
    reason: str


class TeardownFinished(EnvironmentEvent, kw_only=True, tag="teardown_finished"):
    operation_id: str
    outcome: str
    message: str | None


class ResourceRecorded(EnvironmentEvent, kw_only=True, tag="resource_recorded"):
    pass


class Paused(EnvironmentEvent, kw_only=True, tag="paused"):
    paused_at: datetime


class Resumed(EnvironmentEvent, kw_only=True, tag="resumed"):
    pass


class Removed(EnvironmentEvent, kw_only=True, tag="removed"):
    removal_attempt: int


class RemoveFailed(EnvironmentEvent, kw_only=True, tag="remove_failed"):
    removal_attempt: int
    message: str
    retry_at: datetime


ENVIRONMENT_EVENTS = (
    Claimed, Created, CreateFailed, AttemptCleaned, CreateRetried, SetupStarted, SetupSkipped, SetupSucceeded,
    SetupFailed, SetupRetried, Ready, ThreadAttached, ThreadDetached, RetireScheduled,
    RetireCancelled, Cancelled, RemovalStarted, TeardownStarted, TeardownSkipped,
    TeardownFinished, ResourceRecorded, Paused, Resumed, Removed, RemoveFailed,
)


# -- thread and claim facts (stored in the log; not re-published) ----------------------------------


class ThreadEvent(Document):
    thread_id: str
    version: int


class ThreadRegistered(ThreadEvent, kw_only=True, tag="thread_registered"):
    project_path: str | None
    parent_thread_id: str | None
    host_id: str


class ThreadEnvironmentAssigned(ThreadEvent, kw_only=True, tag="thread_environment_assigned"):
    environment_id: str


class ThreadEnvironmentRequested(ThreadEvent, kw_only=True, tag="thread_environment_requested"):
    pass


class ThreadEnvironmentLeft(ThreadEvent, kw_only=True, tag="thread_environment_left"):
    environment_id: str


class ThreadRefused(ThreadEvent, kw_only=True, tag="thread_refused"):
    message: str


class ThreadArchived(ThreadEvent, kw_only=True, tag="thread_archived"):
    pass


class ThreadUnarchived(ThreadEvent, kw_only=True, tag="thread_unarchived"):
    pass


class ClaimEvent(Document):
    claim_id: str
    version: int
    host_id: str
    path: str
    environment_id: str | None


class ClaimTaken(ClaimEvent, kw_only=True, tag="claim_taken"):
    pass


class ClaimRetaken(ClaimEvent, kw_only=True, tag="claim_retaken"):
    pass


class ClaimReleased(ClaimEvent, kw_only=True, tag="claim_released"):
    pass


THREAD_EVENTS = (ThreadRegistered, ThreadEnvironmentAssigned, ThreadEnvironmentRequested, ThreadEnvironmentLeft, ThreadRefused,
                 ThreadArchived, ThreadUnarchived)
CLAIM_EVENTS = (ClaimTaken, ClaimRetaken, ClaimReleased)
LogDocument = (
    Claimed | Created | CreateFailed | AttemptCleaned | CreateRetried | SetupStarted | SetupSkipped | SetupSucceeded
    | SetupFailed | SetupRetried | Ready | ThreadAttached | ThreadDetached | RetireScheduled
    | RetireCancelled | Cancelled | RemovalStarted | TeardownStarted | TeardownSkipped
    | TeardownFinished | ResourceRecorded | Paused | Resumed | Removed | RemoveFailed | ThreadRegistered | ThreadEnvironmentAssigned
    | ThreadEnvironmentRequested | ThreadEnvironmentLeft | ThreadRefused | ThreadArchived | ThreadUnarchived | ClaimTaken
    | ClaimRetaken | ClaimReleased
)
log_decoder = msgspec.json.Decoder(LogDocument)


def _tag(document_type: type[Document]) -> str:
    return document_type.__struct_config__.tag


_BY_STORED_NAME: dict[tuple[str, str], type[Document]] = {
    **{("Environment", t.__name__): t for t in ENVIRONMENT_EVENTS},
    **{("Thread", t.__name__.removeprefix("Thread")): t for t in THREAD_EVENTS},
    **{("PathClaim", t.__name__.removeprefix("Claim")): t for t in CLAIM_EVENTS},
}


def document_for(event: Aggregate.Event, aggregate: Any) -> tuple[str, Document]:
    """The public document and log subject of a stored event, given its aggregate just after it."""
    owner = type(event).__qualname__.split(".")[0]
    document_type = _BY_STORED_NAME[(owner, type(event).__name__)]
    fields = {k: v for k, v in vars(event).items() if k not in ("originator_id", "originator_version", "timestamp")}
    common: dict[str, Any] = {"occurredAt": event.timestamp, "version": event.originator_version}
    if owner == "Environment":
        aggregate_key = "environment"
        common |= {
            "environmentId": str(event.originator_id),
            "threadIds": list(aggregate.thread_ids),
            "status": aggregate.public_status,
            "statusMessage": aggregate.status_message,
        }
        if document_type is Ready:
            fields["path"] = aggregate.path
        if document_type is Claimed:
            fields.pop("thread_id", None)
        fields.pop("resource", None)
        key = str(event.originator_id)
    elif owner == "Thread":
        aggregate_key, key = "thread", aggregate.thread_id
        common["threadId"] = aggregate.thread_id
        fields.pop("thread_id", None)
        fields.pop("intent", None)
    else:
        aggregate_key, key = "claim", str(event.originator_id)
        holder = fields.get("environment_id", aggregate.holder)
        common |= {"claimId": key, "hostId": aggregate.host_id, "path": aggregate.path,
                   "environmentId": str(holder) if holder else None}
        fields = {}
    camel = {_camel(k): (str(v) if k == "environment_id" else v) for k, v in fields.items()}
    document = msgspec.convert(camel | common, document_type, strict=False)
    return subjects.log_event(aggregate_key, key, _tag(document_type)), document


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


# -- inbound thread events (bb.threads.<threadId>.<kind>) ------------------------------------------
#
# Anything a publisher sends that is not declared here, or is out of shape, is refused before a
# command runs, so it never reaches the log. Sizes are bounded here; `inputs` are checked against
# their provider's type before a thread is registered (handlers/threads.py).

# (?!\n): Python's `$` also matches before a trailing newline; JSON Schema's does not.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(?!\n)$"
"""Thread and host ids: one subject token and part of a file name."""
Id = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
PathText = Annotated[str, msgspec.Meta(max_length=4096)]  # PATH_MAX
EnvironmentId = Annotated[str, msgspec.Meta(max_length=64)]  # any form uuid.UUID reads


class Machine(msgspec.Struct, rename="camel", tag_field="type", tag="existing", forbid_unknown_fields=True):
    host_id: Id = "local"


class ProviderIntent(msgspec.Struct, rename="camel", tag_field="type", tag="provider", forbid_unknown_fields=True):
    environment_provider_id: Annotated[str, msgspec.Meta(max_length=128)]
    machine: Machine | None = None
    inputs: Any = None


class ExistingIntent(msgspec.Struct, rename="camel", tag_field="type", tag="existing", forbid_unknown_fields=True):
    environment_id: EnvironmentId


EnvironmentIntent = ProviderIntent | ExistingIntent


class InboundThreadEvent(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", forbid_unknown_fields=True):
    thread_id: Id
    occurred_at: datetime | None = None


class ThreadCreatedMessage(InboundThreadEvent, kw_only=True, tag="created"):
    project_path: PathText | None = None
    parent_thread_id: Id | None = None
    host_id: Id | None = None
    environment: EnvironmentIntent | None = None


class ThreadMessageMessage(InboundThreadEvent, kw_only=True, tag="message"):
    text: str | None = None
    """For whoever runs the thread's agent; this service reads only that a message came."""


class ThreadArchivedMessage(InboundThreadEvent, kw_only=True, tag="archived"):
    pass


class ThreadUnarchivedMessage(InboundThreadEvent, kw_only=True, tag="unarchived"):
    pass


class MessageCancelledMessage(InboundThreadEvent, kw_only=True, tag="message_cancelled"):
    pass


InboundThreadMessage = (
    ThreadCreatedMessage | ThreadMessageMessage | ThreadArchivedMessage | ThreadUnarchivedMessage
    | MessageCancelledMessage
)
inbound_decoder = msgspec.json.Decoder(InboundThreadMessage)


def refusal_reason(error: msgspec.DecodeError | RecursionError) -> str:
    """Why a payload was refused, without its content: msgspec quotes an offending value (an
    unknown `type`, say), which may be a prompt or a secret; where it was is enough. An unknown
    field is named only when its name reads as one: any other name is the publisher's text, and
    a line break in it would forge a line of our log."""
    reason = re.sub(r"^(Invalid (?:enum )?value) .*?((?: - at `[^`]*`)?)$", r"\1 <withheld>\2", str(error), flags=re.S)
    return re.sub(r"^(Object contains unknown field) `(.*?)`((?: - at `[^`]*`)?)$",
                  lambda m: f"{m[1]} `{m[2]}`{m[3]}" if _FIELD_NAME.fullmatch(m[2]) else f"{m[1]} <withheld>{m[3]}",
                  reason, flags=re.S)


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


# -- transcript lines (bb.transcripts.<environmentId>) ---------------------------------------------


class TranscriptLine(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", tag="transcript"):
    occurred_at: datetime
    environment_id: str
    kind: Literal["step", "output"]
    source: str
    text: str

