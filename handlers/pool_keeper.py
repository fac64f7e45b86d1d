"""Keeps each warm pool filled (SPEC 10): a process manager that, every tick and whenever a
member is taken, asks each pool's host where a member would be prepared now, records it on the
pool (members prepared elsewhere are stale: removed, with their teardowns), and claims members
up to the pool's size, which the provisioning driver then creates and sets up like any other
environment.

It yields to the threads' own work: no member is claimed while a thread's own environment on the
pool's host is being created or set up, and a pool has at most MEMBERS_PREPARED_AT_ONCE members
being prepared at a time. Every step is one save of the log's state, decided again from the log
at the next tick: after a crash the next process takes it from there, and two replicas that
decided from one version of a pool conflict in the store.
"""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID, uuid4

from bb_environments.domain.errors import DomainError
from bb_environments.domain.pool import Freshness
from bb_environments.domain.request_errors import RequestError
from bb_environments.handlers.commands import NewEnvironment
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.ports import HostUnavailable, ProviderMissing
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store

log = logging.getLogger(__name__)

REFILL_INTERVAL_S = 1.0
"""How often each pool's host is asked where a member would be prepared now: how soon a commit to
the base makes the members stale and their replacements start (a binding checks it anyway)."""
MEMBERS_PREPARED_AT_ONCE = 2


class PoolKeeper:
    def __init__(self, store: Store, placer: Placer, provisioner: Provisioner) -> None:
        self._store = store
        self._app = store.app
        self._placer = placer
        self._provisioner = provisioner
        self._woken = asyncio.Event()
        self._told: dict[UUID, str] = {}  # the last problem logged per pool, logged once

    def wake(self) -> None:
        """A member was taken or a pool set: refill now rather than at the next tick."""
        self._woken.set()

    async def run(self, interval_s: float = REFILL_INTERVAL_S) -> None:
        while True:
            self._woken.clear()
            try:
                await self.tick()
            except Exception:
                log.exception("the warm pools' refill failed; it runs again in %s s", interval_s)
            try:
                await asyncio.wait_for(self._woken.wait(), interval_s)
            except TimeoutError:
                pass

    async def tick(self) -> None:
        pooled = set()
        for pool_id in await self._store.run(self._app.pool_ids):
            pool = await self._store.run(self._app.pool, pool_id)
            pooled.add((pool.host_id, pool.provider_id))
            try:
                await self._refill(pool_id)
            except (HostUnavailable, ProviderMissing, RequestError, DomainError) as problem:
                if self._told.get(pool_id) != str(problem):
                    self._told[pool_id] = str(problem)
                    log.warning("pool %s cannot prepare members now: %s", pool_id, problem)
        self._placer.pooled = frozenset(pooled)

    async def _refill(self, pool_id: UUID) -> None:
        pool = await self._store.run(self._app.pool, pool_id)
        # Planned as the next member would be (its own path key): the plan reads the base's head.
        placement = await self._placer.place(
            f"pool-{uuid4().hex[:12]}",
            NewEnvironment(pool.provider_id, None, pool.inputs),
            pool.project_path,
            pool.host_id,
            member=True,
        )
        head = placement.base_head
        if head is None:
            raise ProviderMissing(f"the {pool.provider_id!r} provider on host {pool.host_id} does not pool")
        due, preparing = await self._store.run(
            self._app.refill_due, pool_id, Freshness(head.base_commit, head.setup_hash)
        )
        self._told.pop(pool_id, None)
        if due <= 0 or preparing >= MEMBERS_PREPARED_AT_ONCE:
            return
        if await self._store.run(self._app.threads_preparing, pool.host_id):
            return
        member = await self._store.run(self._app.add_member, pool_id, placement)
        if member is not None:
            await self._provisioner.drive(member.id, member)
            self.wake()  # the next member, if more are due, after this one's claim
