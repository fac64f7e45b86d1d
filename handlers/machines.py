"""`bb machine register|list|remove` for hosts: which hosts' agents may connect, and how each is.

A host is registered before anything is placed on it; its agent connects with the seed made
here. The registry is the event log's, so every replica knows the same hosts; the seed is kept by
the replica that made it, and only its public key is recorded. A host is removed only once no
environment that is not removed lives on it, and its seed then stops working at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from bb_environments.domain.errors import HostAlreadyRegistered
from bb_environments.domain.request_errors import InvalidInput, NotFound, Refused
from bb_environments.handlers.placement import check_host_id
from bb_environments.handlers.ports import HostDirectory
from bb_environments.handlers.store import Store
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
    def __init__(
        self, store: Store, hosts: HostDirectory, read_model: ReadModel, own_host_id: str, agent_here: bool = True
    ) -> None:
        """`agent_here`: the agent of this service's own host runs in it (`bb serve` without --no-agent)."""
        self._store = store
        self._registry = store.app.hosts
        self._hosts = hosts
        self._read_model = read_model
        self._own_host_id = own_host_id
        self._agent_here = agent_here

    async def record_seeded_hosts(self) -> None:
        """Record as registered each host whose seed this replica keeps and the log never heard of:
        a data dir of an earlier release kept its registered hosts as seed files only. Safe to
        repeat: a host the log knows (removed since included) is left as it is."""
        await self._store.run(self._registry.register_seeded, self._hosts.seeded())

    async def known(self) -> list[str]:
        """Every host an environment may be placed on: each registered one, and this service's own
        while an agent serves it (its own, or a `bb agent` of that id that has been heard from).
        A replica with --no-agent is not a machine of its own: it only decides."""
        own = [self._own_host_id] if self._agent_here or await self._hosts.last_seen(self._own_host_id) else []
        return sorted({*own, *await self._registered()})

    async def register(self, host_id: str, rotate: bool) -> Registered:
        check_host_id(host_id)
        if host_id == self._own_host_id:
            raise InvalidInput(
                f"host {host_id!r} is this service's own host: its agent runs in `bb serve` "
                "(or, with --no-agent, with the seed credentials/host-" + host_id + ".nk)"
            )
        # Recorded before the seed is written: a refused registration leaves no seed behind, and
        # a crash in between leaves a registration that `--rotate` gives a seed.
        seed = self._hosts.new_seed()
        try:
            await self._store.run(self._registry.register, host_id, seed.public_key, rotate)
        except HostAlreadyRegistered as refused:
            raise InvalidInput(
                f"{refused}: pass --rotate to replace its credentials "
                "(its agent is disconnected and must restart with the new file)"
            ) from None
        return Registered(host_id, await self._hosts.admit(host_id, seed))

    async def machines(self) -> list[Machine]:
        counts = await self._read_model.live_environments_by_host()
        now = datetime.now(UTC)
        listed = []
        # The own host of a service without its agent is listed only while environments live on it.
        hosts = {*await self.known(), *([self._own_host_id] if counts.get(self._own_host_id) else [])}
        for host_id in sorted(hosts):
            seen = await self._hosts.last_seen(host_id)
            status: Literal["online", "offline", "never-seen"] = (
                "never-seen" if seen is None else "online" if heard_recently(seen, now) else "offline"
            )
            listed.append(Machine(host_id, status, seen, counts.get(host_id, 0), host_id == self._own_host_id))
        return listed

    async def remove(self, host_id: str) -> None:
        check_host_id(host_id)
        if host_id == self._own_host_id:
            raise InvalidInput(f"host {host_id!r} is this service's own host; it cannot be removed")
        registered = await self._registered()
        if host_id not in registered:
            raise NotFound(f"no registered host {host_id!r}; registered: {', '.join(registered) or 'none'}")
        if live := (await self._read_model.live_environments_by_host()).get(host_id, 0):
            raise Refused(
                f"host {host_id!r} still holds {live} environment{'s' if live != 1 else ''} that "
                "are not removed: archive their threads (or delete them) first"
            )
        # The seed is refused before the removal is recorded: a crash in between leaves the host
        # registered, and removing it again finishes the job.
        await self._hosts.forget(host_id)
        await self._store.run(self._registry.remove, host_id)

    async def _registered(self) -> list[str]:
        return await self._store.run(self._registry.registered)
