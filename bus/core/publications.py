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
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.documents import Document, type_tag
from bb_environments.domain.environment import Environment
from bb_environments.domain.host_claims import HostClaims
from bb_environments.domain.path_claim import PathClaim
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
        raise LookupError(f"{type(event).__qualname__} has no public document: give it one in "
                          f"bus/core/publications.py")
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


def _published(event: type[Aggregate.Event], document: type[Document], *,
               from_aggregate: tuple[str, ...] = ()) -> tuple[type[Aggregate.Event], Publication]:
    aggregate = next(a for a in _OWNERS if issubclass(event, a.Event))
    return event, Publication(event, document, aggregate, _OWNERS[aggregate].kind, from_aggregate)


PUBLICATIONS: dict[type[Aggregate.Event], Publication] = dict([
    _published(Environment.Claimed, wire.Claimed),
    _published(Environment.Planned, wire.Planned),
    _published(Environment.HostAwaited, wire.HostAwaited),
    _published(Environment.Created, wire.Created),
    _published(Environment.CreateFailed, wire.CreateFailed),
    _published(Environment.AttemptCleaned, wire.AttemptCleaned),
    _published(Environment.CreateRetried, wire.CreateRetried),
    _published(Environment.SetupStarted, wire.SetupStarted),
    _published(Environment.SetupSkipped, wire.SetupSkipped),
    _published(Environment.SetupSucceeded, wire.SetupSucceeded),
    _published(Environment.SetupFailed, wire.SetupFailed),
    _published(Environment.SetupRetried, wire.SetupRetried),
    _published(Environment.Ready, wire.Ready, from_aggregate=("path",)),
    _published(Environment.ThreadAttached, wire.ThreadAttached),
    _published(Environment.ThreadDetached, wire.ThreadDetached),
    _published(Environment.RetireScheduled, wire.RetireScheduled),
    _published(Environment.RetireCancelled, wire.RetireCancelled),
    _published(Environment.Cancelled, wire.Cancelled),
    _published(Environment.RemovalStarted, wire.RemovalStarted),
    _published(Environment.TeardownStarted, wire.TeardownStarted),
    _published(Environment.TeardownSkipped, wire.TeardownSkipped),
    _published(Environment.TeardownFinished, wire.TeardownFinished),
    _published(Environment.ResourceRecorded, wire.ResourceRecorded),
    _published(Environment.Paused, wire.Paused),
    _published(Environment.Resumed, wire.Resumed),
    _published(Environment.WorkSaved, wire.WorkSaved),
    _published(Environment.Removed, wire.Removed),
    _published(Environment.RemoveFailed, wire.RemoveFailed),
    _published(Environment.WorkspaceVanished, wire.WorkspaceVanished),
    _published(Thread.Registered, wire.ThreadRegistered),
    _published(Thread.EnvironmentAssigned, wire.ThreadEnvironmentAssigned),
    _published(Thread.EnvironmentRequested, wire.ThreadEnvironmentRequested),
    _published(Thread.EnvironmentLeft, wire.ThreadEnvironmentLeft),
    _published(Thread.Refused, wire.ThreadRefused),
    _published(Thread.Archived, wire.ThreadArchived),
    _published(Thread.Unarchived, wire.ThreadUnarchived),
    _published(PathClaim.Taken, wire.ClaimTaken),
    _published(PathClaim.Retaken, wire.ClaimRetaken),
    _published(PathClaim.Released, wire.ClaimReleased),
    _published(HostClaims.Started, wire.HostClaimsStarted),
    _published(HostClaims.Held, wire.HostClaimsHeld),
    _published(HostClaims.Released, wire.HostClaimsReleased),
    _published(RegisteredHost.Registered, wire.HostRegistered),
    _published(RegisteredHost.CredentialsRotated, wire.HostCredentialsRotated),
    _published(RegisteredHost.Removed, wire.HostRemoved),
    _published(RegisteredHost.RegisteredAgain, wire.HostRegisteredAgain),
])
"""Every domain event class that is recorded, and its document."""

LogDocument = Union[tuple(dict.fromkeys(p.document for p in PUBLICATIONS.values()))]  # type: ignore[valid-type]
"""Any document of the log (`bb.log.>`, `bb events export`)."""
log_decoder = msgspec.json.Decoder(LogDocument)
