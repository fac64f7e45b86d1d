"""PathClaim: at most one live environment holds a (host, canonical path).

The claim's id is derived from the host and the canonical path, so two environments claiming the
same path write the same aggregate: the second save conflicts and fails as a whole, together with
the environment it tried to create.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.copying import CopiedForCommands
from bb_environments.domain.errors import PathAlreadyClaimed


def claim_id(host_id: str, canonical_path: str) -> UUID:
    return uuid5(NAMESPACE_URL, f"bb-path-claim:{host_id}:{canonical_path}")


class PathClaim(CopiedForCommands, Aggregate):
    if TYPE_CHECKING:  # the event classes the @event decorators below define, as the rest of the code reads them

        class Taken(Aggregate.Created):
            host_id: str
            path: str
            environment_id: UUID

        class Retaken(Aggregate.Event):
            environment_id: UUID

        class Released(Aggregate.Event):
            environment_id: UUID

    @staticmethod
    def create_id(host_id: str, path: str, environment_id: UUID) -> UUID:
        return claim_id(host_id, path)

    @event("Taken")
    def __init__(self, host_id: str, path: str, environment_id: UUID) -> None:
        self.host_id = host_id
        self.path = path
        self.holder: UUID | None = environment_id

    def retake(self, environment_id: UUID) -> None:
        if self.holder is not None and self.holder != environment_id:
            raise PathAlreadyClaimed(f"{self.path} is held by environment {self.holder}")
        if self.holder is None:
            self._retaken(environment_id)

    def release(self, environment_id: UUID) -> None:
        if self.holder == environment_id:
            self._released(environment_id)

    @event("Retaken")
    def _retaken(self, environment_id: UUID) -> None:
        self.holder = environment_id

    @event("Released")
    def _released(self, environment_id: UUID) -> None:
        self.holder = None
