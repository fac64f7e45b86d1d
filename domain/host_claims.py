"""HostClaims: the paths, port blocks and slugs that live environments hold on one host, in one
aggregate, so that every claim decision on that host is made against one version of them.

The nested-path rule (domain/claims.py) asks of every live claim on the host at once, which no
single PathClaim can answer. Saved with every claim taken or released there, this aggregate makes
two writers that decided from the same version conflict: the second save fails as a whole, and its
command decides again on what the first wrote. Only a store that several processes write keeps
one (handlers/writers.py); a single writer checks the rule against what it read of the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.claims import HeldPaths, refuse_nested
from bb_environments.domain.copying import CopiedForCommands
from bb_environments.domain.errors import PathAlreadyClaimed
from bb_environments.domain.leases import HostLeases, PortBlock


def host_claims_id(host_id: str) -> UUID:
    return uuid5(NAMESPACE_URL, f"bb-host-claims:{host_id}")


class HostClaims(CopiedForCommands, Aggregate):
    if TYPE_CHECKING:  # the event classes the @event decorators below define, as the rest of the code reads them

        class Started(Aggregate.Created):
            host_id: str
            held: dict[str, UUID]
            leases: dict[str, dict[str, Any]] | None

        class Held(Aggregate.Event):
            path: str
            environment_id: UUID

        class Released(Aggregate.Event):
            path: str
            environment_id: UUID

        class Leased(Aggregate.Event):
            environment_id: UUID
            slug: str | None
            ports: dict[str, int] | None

        class LeaseEnded(Aggregate.Event):
            environment_id: UUID

    @staticmethod
    def create_id(host_id: str, held: dict[str, UUID], leases: dict[str, dict[str, Any]] | None = None) -> UUID:
        return host_claims_id(host_id)

    @event("Started")
    def __init__(self, host_id: str, held: dict[str, UUID], leases: dict[str, dict[str, Any]] | None = None) -> None:
        """`held` and `leases`: the claims and leases live on the host when its claims began to be
        kept here (a store whose claims were decided by one writer until then)."""
        self.host_id = host_id
        self.paths = HeldPaths()
        for path, holder in held.items():
            self.paths.hold(path, holder)
        self._leases = HostLeases.from_recorded(leases)

    @property
    def leases(self) -> HostLeases:
        # A snapshot taken by a release before leases has none: nothing was leased then.
        leases: HostLeases = self.__dict__.setdefault("_leases", HostLeases())
        return leases

    def hold(self, path: str, environment_id: UUID) -> None:
        """Hold `path` for the environment; refused when another environment holds it, or a path
        inside or around it."""
        refuse_nested(self.paths, path, environment_id)
        holder = self.paths.holder(path)
        if holder is None:
            self._held(path, environment_id)
        elif holder != environment_id:
            raise PathAlreadyClaimed(f"{path} is held by environment {holder}")

    def release(self, path: str, environment_id: UUID) -> None:
        if self.paths.holder(path) == environment_id:
            self._released(path, environment_id)

    def lease(self, environment_id: UUID, slug: str | None, block: PortBlock | None) -> None:
        """Record what the environment holds on the host (chosen free against `leases`)."""
        if self.leases.of(environment_id) != (slug, block):
            self._leased(environment_id, slug, block.recorded() if block else None)

    def end_lease(self, environment_id: UUID) -> None:
        if self.leases.of(environment_id) != (None, None):
            self._lease_ended(environment_id)

    @event("Leased")
    def _leased(self, environment_id: UUID, slug: str | None, ports: dict[str, int] | None) -> None:
        self.leases.lease(environment_id, slug, PortBlock.from_recorded(ports))

    @event("LeaseEnded")
    def _lease_ended(self, environment_id: UUID) -> None:
        self.leases.end(environment_id)

    @event("Held")
    def _held(self, path: str, environment_id: UUID) -> None:
        self.paths.hold(path, environment_id)

    @event("Released")
    def _released(self, path: str, environment_id: UUID) -> None:
        self.paths.release(path)
