"""ProjectSecrets: which secrets a project's hooks get (SPEC 11), by name and when each was set.

Only the names are facts of the log: a value is the secret store's (handlers/secrets.py), never
an event's, nor is anything derived from it (a hash of a short value is as good as the value). Its
id is derived from the project's canonical path, so every replica writes one aggregate per project.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.copying import CopiedForCommands


def project_secrets_id(project_path: str) -> UUID:
    return uuid5(NAMESPACE_URL, f"bb-project-secrets:{project_path}")


class ProjectSecrets(CopiedForCommands, Aggregate):
    if TYPE_CHECKING:  # the event class the @event decorator below defines, as the rest of the code reads it

        class Started(Aggregate.Created):
            project_path: str

    class SecretSet(Aggregate.Event):
        """A class of its own, not an @event method's: its time is when the secret was set, and a
        decorated method runs before the aggregate's `modified_on` moves to its event's time."""

        name: str

        def apply(self, aggregate: Aggregate) -> None:
            assert isinstance(aggregate, ProjectSecrets)
            aggregate.set_at[self.name] = self.timestamp

    class SecretRemoved(Aggregate.Event):
        name: str

        def apply(self, aggregate: Aggregate) -> None:
            assert isinstance(aggregate, ProjectSecrets)
            del aggregate.set_at[self.name]

    @staticmethod
    def create_id(project_path: str) -> UUID:
        return project_secrets_id(project_path)

    @event("Started")
    def __init__(self, project_path: str) -> None:
        self.project_path = project_path
        self.set_at: dict[str, datetime] = {}
        """Each secret's name, with when it was last set."""

    def set(self, name: str) -> None:
        """Record that the secret `name` was given a value (again: a new value is a new fact)."""
        self.trigger_event(self.SecretSet, name=name)

    def remove(self, name: str) -> bool:
        """Record the secret `name` removed; False (nothing recorded) when it was not set."""
        if name not in self.set_at:
            return False
        self.trigger_event(self.SecretRemoved, name=name)
        return True
