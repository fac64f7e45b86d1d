"""`bb pool set|list|resume` (SPEC 10): the operator's requests about warm pools, checked here and
recorded by the application service (handlers/pool_use_cases.py); the refill is the keeper's
(handlers/pool_keeper.py), woken by a pool set or resumed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from bb_environments.domain.errors import UnknownPool
from bb_environments.domain.ids import quoted
from bb_environments.domain.request_errors import InvalidInput, NotFound, Refused
from bb_environments.handlers.commands import NewEnvironment
from bb_environments.handlers.placement import Placer, check_host_id
from bb_environments.handlers.pool_keeper import PoolKeeper
from bb_environments.handlers.pool_use_cases import PoolState
from bb_environments.handlers.ports import HostUnavailable
from bb_environments.handlers.store import Store

SIZE_RULE = "a whole number, 0 or more (0 drains the pool)"


@dataclass(frozen=True)
class PoolSetting:
    project_path: str | None
    provider_id: str
    size: int
    host_id: str | None = None
    inputs: Any = None


class Pools:
    def __init__(self, store: Store, placer: Placer, keeper: PoolKeeper) -> None:
        self._store = store
        self._app = store.app
        self._placer = placer
        self.keeper = keeper

    async def set(self, setting: PoolSetting) -> PoolState:
        """Keep `size` ready members for the key, once the host has checked the project and the
        inputs as it checks a member's (nothing is recorded when it refuses them)."""
        if isinstance(setting.size, bool) or not isinstance(setting.size, int) or setting.size < 0:
            raise InvalidInput(f"size {setting.size!r} is not allowed: use {SIZE_RULE}")
        host_id = await self._placer.check_known(check_host_id(setting.host_id or await self._placer.default_host()))
        profile = self._placer.profile(setting.provider_id)
        if not profile.policy.pool:
            pooling = [p.id for p in self._placer.pooling_profiles()]
            raise InvalidInput(
                f"provider {profile.id!r} cannot keep a warm pool; the providers that can: {', '.join(pooling) or 'none'}"
            )
        inputs = await self._placer.inputs(profile.id, setting.inputs)
        try:
            planned = await self._placer.place(
                "pool-check", NewEnvironment(profile.id, None, inputs), setting.project_path, host_id, member=True
            )
        except HostUnavailable as away:
            raise Refused(f"the pool cannot be checked on host {host_id} now: {away}") from None
        pool = await self._store.run(
            self._app.set_pool, host_id, planned.project_path, profile.id, inputs, setting.size
        )
        self.keeper.wake()
        return await self._state_of(pool.id)

    async def list(self) -> list[PoolState]:
        states: list[PoolState] = await self._store.run(self._app.pool_states)
        return states

    async def resume(self, pool_id: str) -> PoolState:
        try:
            identity = UUID(pool_id)
        except ValueError:
            raise InvalidInput(
                f"pool id {quoted(pool_id)} is not a valid id (expected a UUID, as `bb pool list` shows)"
            ) from None
        try:
            await self._store.run(self._app.resume_pool, identity)
        except UnknownPool as unknown:
            raise NotFound(str(unknown)) from None
        self.keeper.wake()
        return await self._state_of(identity)

    async def _state_of(self, pool_id: UUID) -> PoolState:
        return next(state for state in await self.list() if state.pool.id == pool_id)
