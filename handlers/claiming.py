"""The path claims: which environment holds a path on a host, and how a command takes and releases them.

A claim's id is derived from its host and path, so the store itself refuses two live holders of one
path (the second save conflicts). The nested-path rule (domain/claims.py) is enforced as the store's
writers allow (handlers/writers.py): a single writer checks it against the live claims it indexed
from the log; on a shared store each host's live claims are a HostClaims aggregate, saved with every
claim taken or released there. The leases of ports and slugs (domain/leases.py) are decided beside
the claims, in the same way: against an index of the log's environments, or in the HostClaims.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID, uuid4

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, DomainEventProtocol
from eventsourcing.persistence import Notification, Transcoding

from bb_environments.domain.claims import HeldPaths, refuse_nested
from bb_environments.domain.environment import Environment
from bb_environments.domain.host_claims import HostClaims, host_claims_id
from bb_environments.domain.leases import HostLeases, PortBlock, PortRange
from bb_environments.domain.path_claim import PathClaim, claim_id
from bb_environments.handlers.log_indexes import LogWatch, aggregate_id
from bb_environments.handlers.writers import Writers

HOST_CLAIMS_SNAPSHOT_INTERVAL = 100
"""Each host's HostClaims gains an event per claim taken and released there, for ever: a snapshot
every this many bounds what a replica that has not cached it replays to decide a claim."""


class HeldPathsAsHolders(Transcoding):
    """A HostClaims snapshot's held paths, stored as the holder of each path."""

    type = HeldPaths
    name = "held_paths"

    def encode(self, obj: HeldPaths) -> dict[str, UUID]:
        return obj.holders()

    def decode(self, data: dict[str, UUID]) -> HeldPaths:
        held = HeldPaths()
        for path, holder in data.items():
            held.hold(path, holder)
        return held


class HostLeasesAsRecorded(Transcoding):
    """A HostClaims snapshot's leases, stored as each environment's slug and port block."""

    type = HostLeases
    name = "host_leases"

    def encode(self, obj: HostLeases) -> dict[str, dict[str, Any]]:
        return obj.recorded()

    def decode(self, data: dict[str, dict[str, Any]]) -> HostLeases:
        return HostLeases.from_recorded(data)


class Claims:
    """Every claim ever taken, folded from the log, and the start of each command's claim changes."""

    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch) -> None:
        self._app = app
        self._watch = watch
        self.per_host = writers.claims_per_host
        self._claims: dict[UUID, tuple[str, str, UUID | None]] = {}
        self._held: dict[str, HeldPaths] = {}  # the same claims' live ones, by host
        self.index = writers.log_index(app, watch, PathClaim, ("Taken", "Retaken", "Released"), self._fold)
        self._leases: dict[str, HostLeases] = {}  # the live environments' leases, by host
        self._hosts_of: dict[UUID, str] = {}  # each live environment's host
        self.leases_index = writers.log_index(
            app, watch, Environment, ("Claimed", "Planned", "Removed"), self._fold_lease
        )

    def holder(self, host_id: str, path: str) -> UUID | None:
        """The environment that holds exactly `path` on the host, if one does."""
        self.index.catch_up()  # the usual answer, "nobody", without loading the claim
        _, _, holder_id = self._claims.get(claim_id(host_id, path), (None, None, None))
        return holder_id

    def live(self) -> list[tuple[str, str, UUID | None]]:
        """Every claim with its host, path and holder (None once released)."""
        self.index.catch_up()
        return list(self._claims.values())

    def on_host(self, host_id: str) -> ClaimChanges:
        """What one command will change of the claims on `host_id`."""
        return ClaimChanges(self, host_id)

    def taken(self, host_id: str, path: str) -> PathClaim | None:
        """The claim on `path` if one was ever taken (held or released), to take again."""
        self.index.catch_up()  # it knows every claim ever taken: a new path is not looked up
        return self.stored(host_id, path) if claim_id(host_id, path) in self._claims else None

    def stored(self, host_id: str, path: str) -> PathClaim | None:
        """The claim on `path` as the store has it, if there is one."""
        try:
            return self._app.repository.get(claim_id(host_id, path))
        except AggregateNotFoundError:
            return None

    def refuse_nested_path(self, host_id: str, path: str, environment_id: UUID) -> None:
        """The nested-path rule, against the live claims of the log as this index read it."""
        self.index.catch_up()
        refuse_nested(self._held.get(host_id), path, environment_id)

    def host_claims(self, host_id: str) -> HostClaims:
        """The host's HostClaims, to change, or a new one holding its live claims.

        The log indexes read on past it afterwards: what they count then includes every save it
        includes, and any they miss changed it since (this command's save conflicts)."""
        self._watch.look_again()
        try:
            return self._app.repository.get(host_claims_id(host_id))
        except AggregateNotFoundError:
            # A host whose claims were decided by a single writer until now (or none were): the
            # live ones the log holds are where it starts. A writer that started it meanwhile makes
            # this save conflict, and the command decides again on that one.
            self.index.catch_up()
            held = self._held.get(host_id)
            return HostClaims(
                host_id=host_id, held=held.holders() if held else {}, leases=self.leases_on(host_id).recorded()
            )

    def leases_on(self, host_id: str) -> HostLeases:
        """The leases of the host's live environments, as this index read them from the log."""
        self.leases_index.catch_up()
        return self._leases.get(host_id) or HostLeases()

    def _fold_lease(self, notification: Notification, saved: DomainEventProtocol[UUID] | None) -> None:
        environment_id = aggregate_id(notification)
        if notification.topic.endswith(".Removed"):
            host_id = self._hosts_of.pop(environment_id, None)
            # None of the host's environments may have leased yet: those of a release before leases.
            if host_id is not None and host_id in self._leases:
                self._leases[host_id].end(environment_id)
            return
        event: Any = self._app.mapper.to_domain_event(notification) if saved is None else saved
        if notification.topic.endswith(".Claimed"):
            host_id = self._hosts_of[environment_id] = event.host_id
            slug, block = None, None
        else:  # Planned
            host_id = self._hosts_of[environment_id]
            slug, block = self._leases.setdefault(host_id, HostLeases()).of(environment_id)
        # Events of a release before leases have neither field.
        slug = getattr(event, "slug", None) or slug
        block = PortBlock.from_recorded(getattr(event, "ports", None)) or block
        if slug is not None or block is not None:
            self._leases.setdefault(host_id, HostLeases()).lease(environment_id, slug, block)

    def _fold(self, notification: Notification, saved: DomainEventProtocol[UUID] | None) -> None:
        event = self._app.mapper.to_domain_event(notification) if saved is None else saved
        if isinstance(event, PathClaim.Taken):
            self._claims[event.originator_id] = (event.host_id, event.path, event.environment_id)
        else:
            host_id, path, _ = self._claims[event.originator_id]
            holder = event.environment_id if isinstance(event, PathClaim.Retaken) else None
            self._claims[event.originator_id] = (host_id, path, holder)
        host_id, path, holder = self._claims[event.originator_id]
        held = self._held.setdefault(host_id, HeldPaths())
        if holder is None:
            held.release(path)
        else:
            held.hold(path, holder)


class ClaimChanges:
    """The claims one command takes and releases on one host: `changed` is what it saves with its
    own aggregates, in the same save, so a refused or conflicting command changes none of them."""

    def __init__(self, claims: Claims, host_id: str) -> None:
        self._claims = claims
        self._host_id = host_id
        self._path_claims: list[PathClaim] = []
        self._host: HostClaims | None = None

    @property
    def changed(self) -> list[Aggregate]:
        return [*self._path_claims, *([self._host] if self._host is not None else [])]

    def take(self, path: str, environment_id: UUID, replaced: UUID | None = None) -> None:
        """Claim `path` for the environment; refused when it is held (unless by `replaced`, which
        gives it up here), or nested in a held path."""
        host = self._host_claims()
        if host is None:
            self._claims.refuse_nested_path(self._host_id, path, environment_id)
        else:
            if replaced is not None:
                host.release(path, replaced)
            host.hold(path, environment_id)
        claim = self._claims.taken(self._host_id, path)
        if claim is None:
            claim = PathClaim(host_id=self._host_id, path=path, environment_id=environment_id)
        else:
            if replaced is not None:
                claim.release(replaced)
            claim.retake(environment_id)
        self._path_claims.append(claim)

    def choose_lease(
        self, base: str | None, ports: PortRange | None, listening: Iterable[int]
    ) -> tuple[str | None, PortBlock | None]:
        """A slug from `base` and a block of `ports` (each only if asked for), free on the host now:
        no live environment's, and no port of the block in `listening` (refused: NoFreePorts)."""
        leases = self._host_leases()
        slug = leases.free_slug(base, uuid4().hex) if base is not None else None
        block = leases.free_block(self._host_id, ports, listening) if ports is not None else None
        return slug, block

    def lease(self, environment_id: UUID, slug: str | None, block: PortBlock | None) -> None:
        """Record the environment's lease on the host's claims, where the writers keep them (the
        environment's own event records it in any case)."""
        host = self._host_claims()
        if host is not None:
            host.lease(environment_id, slug, block)

    def end_lease(self, environment_id: UUID) -> None:
        host = self._host_claims()
        if host is not None:
            host.end_lease(environment_id)

    def _host_leases(self) -> HostLeases:
        host = self._host_claims()
        return host.leases if host is not None else self._claims.leases_on(self._host_id)

    def release(self, path: str, environment_id: UUID) -> None:
        """Give up the environment's claim on `path`, if it holds one."""
        claim = self._claims.stored(self._host_id, path)
        if claim is None:
            return
        claim.release(environment_id)
        self._path_claims.append(claim)
        host = self._host_claims()
        if host is not None:
            host.release(path, environment_id)

    def load(self) -> None:
        """Load the host's claims now, before a decision on what the log indexes count (the live
        limits): on a shared store a save those indexes miss then makes this command's conflict."""
        self._host_claims()

    def _host_claims(self) -> HostClaims | None:
        """The host's HostClaims, where the writers keep one (loaded once per command)."""
        if self._host is None and self._claims.per_host:
            self._host = self._claims.host_claims(self._host_id)
        return self._host
