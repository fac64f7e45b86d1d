"""The Thread aggregate: what the core knows of an agent thread and which environment it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.copying import CopiedForCommands
from bb_environments.domain.status import ThreadStatus


def thread_aggregate_id(thread_id: str) -> UUID:
    return uuid5(NAMESPACE_URL, f"bb-thread:{thread_id}")


class Thread(CopiedForCommands, Aggregate):
    if TYPE_CHECKING:  # the event classes the @event decorators below define
        Registered: ClassVar[type[Aggregate.Created]]
        EnvironmentAssigned: ClassVar[type[Aggregate.Event]]
        EnvironmentRequested: ClassVar[type[Aggregate.Event]]
        EnvironmentLeft: ClassVar[type[Aggregate.Event]]
        Refused: ClassVar[type[Aggregate.Event]]
        Archived: ClassVar[type[Aggregate.Event]]
        Unarchived: ClassVar[type[Aggregate.Event]]

    @staticmethod
    def create_id(thread_id: str, **_: Any) -> UUID:
        return thread_aggregate_id(thread_id)

    @event("Registered")
    def __init__(
        self,
        thread_id: str,
        project_path: str | None,
        parent_thread_id: str | None,
        host_id: str,
        intent: dict[str, Any] | None,
    ) -> None:
        self.thread_id = thread_id
        self.project_path = project_path
        self.parent_thread_id = parent_thread_id
        self.host_id = host_id
        self.intent = intent
        self.status = ThreadStatus.ACTIVE
        self.environment_id: UUID | None = None
        self.environment_requested = False
        self.refusal: str | None = None

    @property
    def needs_environment(self) -> bool:
        return self.status == ThreadStatus.ACTIVE and self.environment_id is None

    @property
    def awaits_environment(self) -> bool:
        """Its first message asked for an environment that was neither given nor refused yet."""
        return self.needs_environment and self.environment_requested and self.refusal is None

    def request_environment(self) -> None:
        if self.needs_environment and not self.environment_requested:
            self._environment_requested()

    def assign_environment(self, environment_id: UUID) -> None:
        if self.environment_id != environment_id:
            self._environment_assigned(environment_id)

    def leave_environment(self) -> None:
        if self.environment_id is not None:
            self._environment_left(self.environment_id)

    def refuse(self, message: str) -> None:
        self._refused(message)

    def archive(self) -> bool:
        if self.status == ThreadStatus.ARCHIVED:
            return False
        self._archived()
        return True

    def unarchive(self) -> bool:
        if self.status == ThreadStatus.ACTIVE:
            return False
        self._unarchived()
        return True

    @event("EnvironmentAssigned")
    def _environment_assigned(self, environment_id: UUID) -> None:
        self.environment_id = environment_id
        self.refusal = None

    @event("EnvironmentRequested")
    def _environment_requested(self) -> None:
        self.environment_requested = True
        self.refusal = None

    @event("EnvironmentLeft")
    def _environment_left(self, environment_id: UUID) -> None:
        self.environment_id = None
        self.environment_requested = False

    @event("Refused")
    def _refused(self, message: str) -> None:
        self.refusal = message

    @event("Archived")
    def _archived(self) -> None:
        self.status = ThreadStatus.ARCHIVED

    @event("Unarchived")
    def _unarchived(self) -> None:
        self.status = ThreadStatus.ACTIVE
