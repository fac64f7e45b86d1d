"""RegisteredHost: a host whose agent may connect (SPEC 7.1), with the public key of its agent's seed.

The registry is in the log, not in the seed files of one data dir, so that every core replica on
the store knows the same hosts: a host registered through one replica is placed on and removed
through any other. Its id is derived from the host id, so two replicas registering one host write
the same aggregate: the second save conflicts and its command decides again on what the first
wrote. Only the public key is recorded; the seed is the agent's secret and stays in a file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.copying import CopiedForCommands
from bb_environments.domain.errors import HostAlreadyRegistered


def registered_host_id(host_id: str) -> UUID:
    return uuid5(NAMESPACE_URL, f"bb-registered-host:{host_id}")


class RegisteredHost(CopiedForCommands, Aggregate):
    if TYPE_CHECKING:  # the event classes the @event decorators below define, as the rest of the code reads them

        class Registered(Aggregate.Created):
            host_id: str
            public_key: str

        class CredentialsRotated(Aggregate.Event):
            public_key: str

        class Removed(Aggregate.Event):
            pass

        class RegisteredAgain(Aggregate.Event):
            public_key: str

    @staticmethod
    def create_id(host_id: str, public_key: str) -> UUID:
        return registered_host_id(host_id)

    @event("Registered")
    def __init__(self, host_id: str, public_key: str) -> None:
        self.host_id = host_id
        self.public_key = public_key
        self.removed = False

    def register(self, public_key: str, rotate: bool) -> None:
        """Register the host once more: a removed host is registered again; a registered one is
        refused, unless `rotate` replaces its agent's key with `public_key`."""
        if self.removed:
            self._registered_again(public_key)
        elif not rotate:
            raise HostAlreadyRegistered(f"host {self.host_id!r} is registered already")
        elif public_key != self.public_key:
            self._credentials_rotated(public_key)

    def remove(self) -> None:
        if not self.removed:
            self._removed()

    @event("CredentialsRotated")
    def _credentials_rotated(self, public_key: str) -> None:
        self.public_key = public_key

    @event("Removed")
    def _removed(self) -> None:
        self.removed = True

    @event("RegisteredAgain")
    def _registered_again(self, public_key: str) -> None:
        self.public_key = public_key
        self.removed = False
