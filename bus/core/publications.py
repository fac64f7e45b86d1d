"""Which public document (bus/wire/documents.py) each recorded domain event class is published as,
and the document and log subject the relay makes of a stored event.

One table keyed by the domain event class: renaming a Python class never breaks a subscriber or an
old log, and an event without a document is found by a unit test, not by the relay. Its order is
the catalog's (entrypoints/catalog.py makes docs/events.md and the schemas in this order).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union
from uuid import UUID

import msgspec
from eventsourcing.domain import Aggregate, DomainEventProtocol

from bb_environments.bus.wire import documents as wire
from bb_environments.bus.wire import log_only_documents as log_only
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.documents import Document, type_tag
from bb_environments.domain.environment import Environment
from bb_environments.domain.host_claims import HostClaims
from bb_environments.domain.path_claim import PathClaim
from bb_environments.domain.pool import Pool, PoolList
from bb_environments.domain.project_secrets import ProjectSecrets
from bb_environments.domain.registered_host import RegisteredHost
from bb_environments.domain.thread import Thread


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


def document_for(event: DomainEventProtocol[UUID], aggregate: Any) -> tuple[str, Document]:
    """The public document and log subject of a stored event, given its aggregate just after it."""
    if not isinstance(event, Aggregate.Event) or type(event) not in PUBLICATIONS:
        raise LookupError(f"{type(event).__qualname__} has no public document: give it one in bus/core/publications.py")
    publication = PUBLICATIONS[type(event)]
    owner = _OWNERS[publication.aggregate]
    # What the event recorded, as far as the document declares it (msgspec drops the rest: a
    # provider's private `resource`, a thread's `intent`).
    fields = {
        _camel(k): (str(v) if isinstance(v, UUID) else v)
        for k, v in vars(event).items()
        if k not in ("originator_id", "originator_version", "timestamp")
    }
    fields |= {_camel(name): getattr(aggregate, name) for name in publication.from_aggregate}
    # An event records its optional fields as None where they do not apply; the document leaves them out.
    fields = {
        name: value
        for name, value in fields.items()
        if value is not None or name not in _optional(publication.document)
    }
    common = {"occurredAt": event.timestamp, "version": event.originator_version} | owner.common(event, aggregate)
    document = msgspec.convert(fields | common, publication.document, strict=False)
    key = owner.key(event, aggregate)
    return subjects.log_event(owner.kind, key, publication.type), document


@functools.cache
def _optional(document: type[Document]) -> frozenset[str]:
    """The fields of `document` that may be absent (msgspec.UNSET), by their name on the wire."""
    return frozenset(field.encode_name for field in msgspec.structs.fields(document) if field.default is msgspec.UNSET)


@functools.cache  # an event's field names, a few dozen in all, at every document the relay publishes
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _claim_holder(event: Any, claim: PathClaim) -> str | None:
    holder = getattr(event, "environment_id", claim.holder)
    return str(holder) if holder else None


_OWNERS: dict[type[Aggregate], _Owner] = {
    Environment: _Owner(
        "environment",
        key=lambda event, _: str(event.originator_id),
        common=lambda event, environment: {
            "environmentId": str(event.originator_id),
            "threadIds": list(environment.thread_ids),
            "status": environment.public_status,
            "statusMessage": environment.status_message,
        },
    ),
    Thread: _Owner(
        "thread", key=lambda _, thread: thread.thread_id, common=lambda _, thread: {"threadId": thread.thread_id}
    ),
    PathClaim: _Owner(
        "claim",
        key=lambda event, _: str(event.originator_id),
        common=lambda event, claim: {
            "claimId": str(event.originator_id),
            "hostId": claim.host_id,
            "path": claim.path,
            "environmentId": _claim_holder(event, claim),
        },
    ),
    HostClaims: _Owner("host", key=lambda _, host: host.host_id, common=lambda _, host: {"hostId": host.host_id}),
    RegisteredHost: _Owner(
        "machine", key=lambda _, host: host.host_id, common=lambda _, host: {"hostId": host.host_id}
    ),
    Pool: _Owner(
        "pool",
        key=lambda event, _: str(event.originator_id),
        common=lambda event, _: {"poolId": str(event.originator_id)},
    ),
    PoolList: _Owner("pools", key=lambda event, _: str(event.originator_id), common=lambda _, __: {}),
    ProjectSecrets: _Owner(
        "project",
        key=lambda event, _: str(event.originator_id),
        common=lambda event, secrets: {
            "projectSecretsId": str(event.originator_id),
            "projectPath": secrets.project_path,
        },
    ),
}


def _published(
    event: type[Aggregate.Event], document: type[Document], *, from_aggregate: tuple[str, ...] = ()
) -> tuple[type[Aggregate.Event], Publication]:
    aggregate = next(a for a in _OWNERS if issubclass(event, a.Event))
    return event, Publication(event, document, aggregate, _OWNERS[aggregate].kind, from_aggregate)


PUBLICATIONS: dict[type[Aggregate.Event], Publication] = dict(
    [
        _published(Environment.Claimed, wire.ClaimedDocument),
        _published(Environment.Planned, wire.PlannedDocument),
        _published(Environment.HostAwaited, wire.HostAwaitedDocument),
        _published(Environment.Created, wire.CreatedDocument),
        _published(Environment.CreateFailed, wire.CreateFailedDocument),
        _published(Environment.AttemptCleaned, wire.AttemptCleanedDocument),
        _published(Environment.CreateRetried, wire.CreateRetriedDocument),
        _published(Environment.SetupStarted, wire.SetupStartedDocument),
        _published(Environment.SetupSkipped, wire.SetupSkippedDocument),
        _published(Environment.SetupSucceeded, wire.SetupSucceededDocument),
        _published(Environment.SetupFailed, wire.SetupFailedDocument),
        _published(Environment.SetupRetried, wire.SetupRetriedDocument),
        _published(Environment.Ready, wire.ReadyDocument, from_aggregate=("path",)),
        _published(Environment.ThreadAttached, wire.ThreadAttachedDocument),
        _published(Environment.ThreadDetached, wire.ThreadDetachedDocument),
        _published(Environment.RetireScheduled, wire.RetireScheduledDocument),
        _published(Environment.RetireCancelled, wire.RetireCancelledDocument),
        _published(Environment.Cancelled, wire.CancelledDocument),
        _published(Environment.RemovalStarted, wire.RemovalStartedDocument),
        _published(Environment.TeardownStarted, wire.TeardownStartedDocument),
        _published(Environment.TeardownSkipped, wire.TeardownSkippedDocument),
        _published(Environment.TeardownFinished, wire.TeardownFinishedDocument),
        _published(Environment.ResourceRecorded, wire.ResourceRecordedDocument),
        _published(Environment.Paused, wire.PausedDocument),
        _published(Environment.ResumeRequested, wire.ResumeRequestedDocument),
        _published(Environment.Resumed, wire.ResumedDocument),
        _published(Environment.WorkSaved, wire.WorkSavedDocument),
        _published(Environment.Removed, wire.RemovedDocument),
        _published(Environment.RemoveFailed, wire.RemoveFailedDocument),
        _published(Environment.WorkspaceVanished, wire.WorkspaceVanishedDocument),
        _published(Environment.Pooled, wire.PooledDocument),
        _published(Environment.Bound, wire.BoundDocument),
        _published(Environment.DiskMeasured, wire.DiskMeasuredDocument),
        _published(Thread.Registered, log_only.ThreadRegisteredDocument),
        _published(Thread.EnvironmentAssigned, log_only.ThreadEnvironmentAssignedDocument),
        _published(Thread.EnvironmentRequested, log_only.ThreadEnvironmentRequestedDocument),
        _published(Thread.EnvironmentLeft, log_only.ThreadEnvironmentLeftDocument),
        _published(Thread.Refused, log_only.ThreadRefusedDocument),
        _published(Thread.Archived, log_only.ThreadArchivedDocument),
        _published(Thread.Unarchived, log_only.ThreadUnarchivedDocument),
        _published(PathClaim.Taken, log_only.ClaimTakenDocument),
        _published(PathClaim.Retaken, log_only.ClaimRetakenDocument),
        _published(PathClaim.Released, log_only.ClaimReleasedDocument),
        _published(HostClaims.Started, log_only.HostClaimsStartedDocument),
        _published(HostClaims.Held, log_only.HostClaimsHeldDocument),
        _published(HostClaims.Released, log_only.HostClaimsReleasedDocument),
        _published(HostClaims.Leased, log_only.HostClaimsLeasedDocument),
        _published(HostClaims.LeaseEnded, log_only.HostClaimsLeaseEndedDocument),
        _published(RegisteredHost.Registered, log_only.HostRegisteredDocument),
        _published(RegisteredHost.CredentialsRotated, log_only.HostCredentialsRotatedDocument),
        _published(RegisteredHost.Removed, log_only.HostRemovedDocument),
        _published(RegisteredHost.RegisteredAgain, log_only.HostRegisteredAgainDocument),
        _published(Pool.Set, log_only.PoolSetDocument),
        _published(Pool.Resized, log_only.PoolResizedDocument),
        _published(Pool.BaseSeen, log_only.PoolBaseSeenDocument),
        _published(Pool.MemberAdded, log_only.PoolMemberAddedDocument),
        _published(Pool.MemberLeft, log_only.PoolMemberLeftDocument),
        _published(Pool.MemberPooled, log_only.PoolMemberPooledDocument),
        _published(Pool.MemberFailed, log_only.PoolMemberFailedDocument),
        _published(Pool.Paused, log_only.PoolPausedDocument),
        _published(Pool.Resumed, log_only.PoolResumedDocument),
        _published(PoolList.Started, log_only.PoolListStartedDocument),
        _published(PoolList.Added, log_only.PoolListAddedDocument),
        _published(ProjectSecrets.Started, log_only.ProjectSecretsStartedDocument),
        _published(ProjectSecrets.SecretSet, log_only.SecretSetDocument),
        _published(ProjectSecrets.SecretRemoved, log_only.SecretRemovedDocument),
    ]
)
"""Every domain event class that is recorded, and its document."""

LogDocument = Union[tuple(dict.fromkeys(p.document for p in PUBLICATIONS.values()))]  # type: ignore[valid-type]  # noqa: UP007 (made from a tuple)
"""Any document of the log (`bb.log.>`, `bb events export`)."""
log_decoder = msgspec.json.Decoder(LogDocument)
