"""`bb machine register|list|remove` for hosts: which hosts' agents may connect, and how each is.

A host is registered before anything is placed on it; its agent connects with the seed made
here. It is removed only once no environment that is not removed lives on it, and its seed then
stops working at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from bb_environments.handlers.errors import InvalidInput, NotFound, Refused
from bb_environments.handlers.placement import check_host_id
from bb_environments.handlers.ports import HostDirectory
from bb_environments.projections.read_model import ReadModel

OFFLINE_AFTER_S = 15.0
"""An agent not heard from for this long is offline (SPEC 7.1)."""


def heard_recently(seen: datetime, now: datetime) -> bool:
    """Whether an agent last heard from at `seen` is online at `now`."""
    return (now - seen).total_seconds() < OFFLINE_AFTER_S


@dataclass(frozen=True)
class Registered:
    host_id: str
    credentials: str


@dataclass(frozen=True)
class Machine:
    id: str
    status: Literal["online", "offline", "never-seen"]
    last_seen_at: datetime | None
    environments: int
    own: bool
    """The service's own host (its agent runs in `bb serve`, unless started with --no-agent)."""


class Machines:
    def __init__(self, hosts: HostDirectory, read_model: ReadModel, own_host_id: str) -> None:
        self._hosts = hosts
        self._read_model = read_model
        self._own_host_id = own_host_id

    def known(self) -> list[str]:
        """Every host an environment may be placed on: this service's own and each registered one."""
        return sorted({self._own_host_id, *self._hosts.registered()})

    async def register(self, host_id: str, rotate: bool) -> Registered:
        check_host_id(host_id)
        if host_id == self._own_host_id:
            raise InvalidInput(f"host {host_id!r} is this service's own host: its agent runs in `bb serve` "
                               "(or, with --no-agent, with the seed credentials/host-" + host_id + ".nk)")
        if host_id in self._hosts.registered() and not rotate:
            raise InvalidInput(f"host {host_id!r} is registered already: pass --rotate to replace its credentials "
                               "(its agent is disconnected and must restart with the new file)")
        return Registered(host_id, await self._hosts.register(host_id))

    async def machines(self) -> list[Machine]:
        counts = await self._read_model.live_environments_by_host()
        now = datetime.now(timezone.utc)
        listed = []
        for host_id in self.known():
            seen = await self._hosts.last_seen(host_id)
            status: Literal["online", "offline", "never-seen"] = (
                "never-seen" if seen is None else "online" if heard_recently(seen, now) else "offline")
            listed.append(Machine(host_id, status, seen, counts.get(host_id, 0), host_id == self._own_host_id))
        return listed

    async def remove(self, host_id: str) -> None:
        check_host_id(host_id)
        if host_id == self._own_host_id:
            raise InvalidInput(f"host {host_id!r} is this service's own host; it cannot be removed")
        if host_id not in self._hosts.registered():
            raise NotFound(f"no registered host {host_id!r}; registered: {', '.join(self._hosts.registered()) or 'none'}")
        if live := (await self._read_model.live_environments_by_host()).get(host_id, 0):
            raise Refused(f"host {host_id!r} still holds {live} environment{'s' if live != 1 else ''} that "
                          "are not removed: archive their threads (or delete them) first")
        await self._hosts.forget(host_id)
