"""The `Workspaces` port for a host whose agent is a process of its own, reached only over the bus.

What changes the host (a create, a removal) is a job queued for its agent (bus/core/job_queue.py)
and survives the agent's absence; what only looks (a plan, the providers, a survey) is a request
the agent answers at once, and waits (HostUnavailable) when nobody answers. The host's provider
profiles are the core's own: every host runs the same release's providers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER

from bb_environments.bus.core.job_queue import HostJobs
from bb_environments.bus.health import BUS_UNAVAILABLE, describe
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import (
    CreateJob,
    CreateReport,
    InputsQuery,
    NoArguments,
    ProjectQuery,
    ProviderList,
    RemoveJob,
    RemoveReport,
    WorkspaceAnswer,
)
from bb_environments.handlers.ports import HostUnavailable
from bb_environments.providers.contract import CreateResult, InvalidInputs, PlanRefused, ProviderMissing, RemoveResult
from bb_environments.providers.registry import ProviderDescription, ProviderProfile
from bb_environments.providers.workspace_messages import (
    CreateRequest,
    LeftoverRemoval,
    PauseFailed,
    PauseResult,
    Plan,
    PlanRequest,
    RemoveRequest,
    ResourceRequest,
    ResumeFailed,
    ResumeResult,
    Survey,
    SurveyRequest,
)

T = TypeVar("T")

QUERY_TIMEOUT_S = 10.0
_REFUSALS: dict[str, type[Exception]] = {
    "invalid_inputs": InvalidInputs, "plan_refused": PlanRefused, "provider_missing": ProviderMissing}


def create_operation(request: CreateRequest) -> str:
    return f"{request.environment_id}.create.{request.attempt}"


def remove_operation(request: RemoveRequest) -> str:
    if request.removal_attempt == 0:
        return f"{request.environment_id}.cleanup.{request.attempt}"
    return f"{request.environment_id}.remove.{request.removal_attempt}"


class RemoteWorkspaces:
    def __init__(self, nc: Client, jobs: HostJobs, profiles: Mapping[str, ProviderProfile]) -> None:
        self._nc = nc
        self._jobs = jobs
        self._profiles = profiles

    def profiles(self, host_id: str) -> Mapping[str, ProviderProfile]:
        return self._profiles

    async def providers(self, host_id: str) -> list[ProviderDescription]:
        return await self._ask(host_id, "providers", NoArguments(), ProviderList)

    async def inputs(self, host_id: str, provider_id: str, inputs: Any) -> Any:
        return await self._ask(host_id, "inputs", InputsQuery(provider_id, inputs), Any)

    async def canonical_project(self, host_id: str, project_path: str | None) -> str | None:
        return await self._ask(host_id, "canonical-project", ProjectQuery(project_path), str | None)  # type: ignore[arg-type]

    async def plan(self, request: PlanRequest) -> Plan:
        return await self._ask(request.host_id, "plan", request, Plan)

    async def planned_path(self, request: PlanRequest) -> str | None:
        return await self._ask(request.host_id, "planned-path", request, str | None)  # type: ignore[arg-type]

    async def create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        """A create, once queued, runs to its end on the host; a cancelled environment then
        removes what it made (the driver's cleanup), as for a create that was past stopping."""
        job = CreateJob(create_operation(request), request)
        return (await self._jobs.run(request.host_id, job, CreateReport)).result

    async def remove(self, request: RemoveRequest, cancelled: threading.Event) -> RemoveResult:
        job = RemoveJob(remove_operation(request), request)
        return (await self._jobs.run(request.host_id, job, RemoveReport, again=request.removal_attempt == 0)).result

    async def idle_pause_due(self, host_id: str, provider_id: str, last_activity: datetime, now: datetime) -> bool:
        return False  # no provider of a host pauses: pausing is a cloud provider's, which runs in the core

    async def pause(self, request: ResourceRequest,
                    checkpoint: Callable[[dict[str, Any]], Coroutine[Any, Any, object]]) -> PauseResult:
        return PauseFailed(f"environments on host {request.host_id!r} do not pause")

    async def resume(self, request: ResourceRequest) -> ResumeResult:
        return ResumeFailed(f"environments on host {request.host_id!r} do not pause")

    async def survey(self, request: SurveyRequest) -> Survey:
        return await self._ask(request.host_id, "survey", request, Survey)

    async def remove_leftover(self, request: LeftoverRemoval) -> RemoveResult:
        return await self._ask(request.host_id, "remove-leftover", request, RemoveResult)  # type: ignore[arg-type]

    async def _ask(self, host_id: str, verb: str, body: msgspec.Struct, answer_type: type[T]) -> T:
        try:
            reply = await self._nc.request(subjects.host_workspaces(host_id, verb), msgspec.json.encode(body),
                                           timeout=QUERY_TIMEOUT_S)
        except BUS_UNAVAILABLE as error:
            away = await self._jobs.away(host_id, f"asking host {host_id!r} to {verb}")
            raise away or HostUnavailable(f"no agent answers for host {host_id!r} ({describe(error)})") from None
        if reply.headers and (code := reply.headers.get(ERROR_CODE_HEADER)):
            raise HostUnavailable(f"the agent of host {host_id!r} answered {verb} with {code}: "
                                  f"{reply.headers.get(ERROR_HEADER)}")
        try:
            answer = msgspec.json.decode(reply.data, type=WorkspaceAnswer)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise HostUnavailable(f"the agent of host {host_id!r} answered {verb} with something else") from None
        if answer.refused is not None:
            raise _REFUSALS[answer.refused](answer.message or answer.refused)
        return msgspec.convert(answer.answer, answer_type)
