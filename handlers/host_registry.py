"""The registered hosts as the log has them, and the commands that change them (SPEC 7.1).

Every replica on the store reads the same registry: a log index of the RegisteredHost events keeps
which hosts are registered now, so asking is cheap, and every change is a RegisteredHost saved by
the command that decided it (run by the Store, so a command that lost a race decides again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, DomainEventProtocol
from eventsourcing.persistence import Notification

from bb_environments.domain.registered_host import RegisteredHost, registered_host_id
from bb_environments.handlers.log_indexes import LogWatch, aggregate_id
from bb_environments.handlers.writers import Writers


class HostRegistry:
    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch, save: Callable[..., object]) -> None:
        """`save`: the application's save of changed aggregates, in one transaction."""
        self._app = app
        self._save = save
        self._host_ids: dict[UUID, str] = {}  # every host the log ever registered, by aggregate id
        self._registered: set[str] = set()
        self.index = writers.log_index(
            app, watch, RegisteredHost, ("Registered", "RegisteredAgain", "Removed"), self._fold
        )

    def registered(self) -> list[str]:
        """The hosts registered now, in id order."""
        self.index.catch_up()
        return sorted(self._registered)

    def register(self, host_id: str, public_key: str, rotate: bool) -> None:
        """Record the host registered with its agent's `public_key`: refused while it is registered
        already, unless `rotate` (which registers a host that is not, too)."""
        host = self._stored(host_id)
        if host is None:
            host = RegisteredHost(host_id=host_id, public_key=public_key)
        else:
            host.register(public_key, rotate)
        self._save_changed([host])

    def remove(self, host_id: str) -> None:
        host = self._stored(host_id)
        if host is not None:
            host.remove()
            self._save_changed([host])

    def register_seeded(self, public_keys: Mapping[str, str]) -> None:
        """Record as registered each of these hosts (by id, the public key of its seed file) that
        the log never registered: a data dir of an earlier release kept its hosts as seed files
        only. A host the log knows, removed since included, is left as the log has it."""
        self.index.catch_up()
        known = set(self._host_ids.values())
        self._save_changed(
            [
                RegisteredHost(host_id=host_id, public_key=public_key)
                for host_id, public_key in sorted(public_keys.items())
                if host_id not in known
            ]
        )

    def _stored(self, host_id: str) -> RegisteredHost | None:
        """The host's registry entry as the store has it, to change (None: never registered)."""
        self.index.catch_up()  # a new host is not looked up in the store
        if registered_host_id(host_id) not in self._host_ids:
            return None
        host: RegisteredHost = self._app.repository.get(registered_host_id(host_id), deepcopy_from_cache=True)
        return host

    def _save_changed(self, hosts: list[RegisteredHost]) -> None:
        changed: list[Aggregate] = [host for host in hosts if host.pending_events]
        if changed:
            self._save(*changed)

    def _fold(self, notification: Notification, saved: DomainEventProtocol[UUID] | None) -> None:
        if notification.topic.endswith(".Registered"):
            event = self._app.mapper.to_domain_event(notification) if saved is None else saved
            assert isinstance(event, RegisteredHost.Registered)  # the topic says so
            self._host_ids[event.originator_id] = event.host_id
        host_id = self._host_ids[aggregate_id(notification)]
        if notification.topic.endswith(".Removed"):
            self._registered.discard(host_id)
        else:
            self._registered.add(host_id)
