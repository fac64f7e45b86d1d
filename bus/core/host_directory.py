"""The registered hosts' agents as the bus knows them: each agent's seed file that this replica keeps
(bus/access.py Credentials), the NATS users the embedded server admits, each host's queue
consumer, and its heartbeat. Which hosts are registered is the event log's.

Admitting a seed writes it, then has the embedded server admit it (a reload of its configuration,
no restart), then makes the host's consumer; forgetting a host does the same in reverse, so the
old seed is refused at once. With an external NATS the deployment adds the host's user itself
(docs/security.md); the seed is still written here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bb_environments.bus.access import Credentials, new_seed, seed_public_key
from bb_environments.bus.core.job_queue import HostLiveness
from bb_environments.bus.streams import ensure_host_jobs_consumer
from bb_environments.bus.wire import subjects
from bb_environments.handlers.ports import AgentSeed


class BusHostDirectory:
    def __init__(
        self,
        credentials: Credentials,
        js: JetStreamContext,
        liveness: HostLiveness,
        admit_users: Callable[[], None] | None,
    ) -> None:
        """`admit_users` has the embedded server enforce the users as the seeds now say (None: an
        external NATS, whose users the deployment configures)."""
        self._credentials = credentials
        self._js = js
        self._liveness = liveness
        self._admit_users = admit_users
        self._changing = asyncio.Lock()

    def seeded(self) -> dict[str, str]:
        return {host_id: self._credentials.host_public_key(host_id) for host_id in self._credentials.registered_hosts()}

    def new_seed(self) -> AgentSeed:
        seed = new_seed()
        return AgentSeed(seed_public_key(seed), seed)

    async def admit(self, host_id: str, seed: AgentSeed) -> str:
        async with self._changing:
            path = await asyncio.to_thread(self._credentials.register_host, host_id, seed.seed)
            await self._admit()
            await ensure_host_jobs_consumer(self._js, host_id)
            return str(path)

    async def forget(self, host_id: str) -> None:
        async with self._changing:
            await asyncio.to_thread(self._credentials.forget_host, host_id)
            await self._admit()
            try:
                await self._js.delete_consumer(subjects.HOST_JOBS_STREAM, subjects.host_jobs_consumer(host_id))
            except NotFoundError:
                pass
            await self._js.purge_stream(subjects.HOST_JOBS_STREAM, subject=subjects.host_jobs(host_id))
            await self._liveness.forget(host_id)

    async def last_seen(self, host_id: str) -> datetime | None:
        heartbeat = await self._liveness.heartbeat(host_id)
        return None if heartbeat is None else heartbeat.seen_at

    async def _admit(self) -> None:
        if self._admit_users is not None:
            await asyncio.to_thread(self._admit_users)
