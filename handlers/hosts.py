"""Which process does an environment's host work: the `Workspaces` port, routed per call.

The host whose agent runs in this process is served here (its workspaces under its root), the
cloud providers (whose resource lives in no host's filesystem: Modal) by the core itself (their
data under its data dir), and every other host by its own agent, over the bus.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any

from bb_environments.handlers.ports import Workspaces
from bb_environments.providers.contract import CreateResult, RemoveResult
from bb_environments.providers.registry import ProviderDescription, ProviderProfile
from bb_environments.providers.workspace_messages import (
    CreateRequest,
    LeftoverRemoval,
    PauseResult,
    Plan,
    PlanRequest,
    RemoveRequest,
    ResourceRequest,
    ResumeResult,
    Survey,
    SurveyRequest,
)


class RoutedWorkspaces:
    def __init__(self, here: Workspaces, cloud: Workspaces, elsewhere: Workspaces, host_here: str | None,
                 cloud_providers: frozenset[str]) -> None:
        """`host_here`: the host whose agent runs in this process (None: every host's is elsewhere)."""
        self._here = here
        self._cloud = cloud
        self._elsewhere = elsewhere
        self._host_here = host_here
        self._cloud_providers = cloud_providers

    def _for(self, host_id: str, provider_id: str | None = None) -> Workspaces:
        if provider_id in self._cloud_providers:
            return self._cloud
        return self._here if host_id == self._host_here else self._elsewhere

    def profiles(self, host_id: str) -> Mapping[str, ProviderProfile]:
        return self._for(host_id).profiles(host_id)

    async def providers(self, host_id: str) -> list[ProviderDescription]:
        return await self._for(host_id).providers(host_id)

    async def inputs(self, host_id: str, provider_id: str, inputs: Any) -> Any:
        # The inputs' type is the provider's, which is the core's release too: read here, so that a
        # thread event's intent is checked while its host is away.
        return await self._cloud.inputs(host_id, provider_id, inputs)

    async def canonical_project(self, host_id: str, project_path: str | None) -> str | None:
        return await self._for(host_id).canonical_project(host_id, project_path)

    async def plan(self, request: PlanRequest) -> Plan:
        return await self._for(request.host_id, request.provider_id).plan(request)

    async def planned_path(self, request: PlanRequest) -> str | None:
        return await self._for(request.host_id, request.provider_id).planned_path(request)

    async def create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        return await self._for(request.host_id, request.provider_id).create(request, cancelled)

    async def remove(self, request: RemoveRequest, cancelled: threading.Event) -> RemoveResult:
        return await self._for(request.host_id, request.provider_id).remove(request, cancelled)

    async def idle_pause_due(self, host_id: str, provider_id: str, last_activity: datetime, now: datetime) -> bool:
        return await self._for(host_id, provider_id).idle_pause_due(host_id, provider_id, last_activity, now)

    async def pause(self, request: ResourceRequest,
                    checkpoint: Callable[[dict[str, Any]], Coroutine[Any, Any, object]]) -> PauseResult:
        return await self._for(request.host_id, request.provider_id).pause(request, checkpoint)

    async def resume(self, request: ResourceRequest) -> ResumeResult:
        return await self._for(request.host_id, request.provider_id).resume(request)

    async def survey(self, request: SurveyRequest) -> Survey:
        return await self._for(request.host_id).survey(request)

    async def remove_leftover(self, request: LeftoverRemoval) -> RemoveResult:
        return await self._for(request.host_id, request.leftover.provider_id).remove_leftover(request)
