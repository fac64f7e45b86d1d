"""The `Host` port for a host whose agent runs elsewhere (a `bb agent`, or another replica's
`bb serve`), reached only over the bus, each verb as bus/wire/host_protocol.py's VERBS says.

What changes the host (a create, a removal, a hook) is a job queued for its agent
(bus/core/job_queue.py) and survives the agent's absence; what only looks (a plan, the providers,
a survey, a hook's output) or stops a hook is a request the agent answers at once, and waits
(HostUnavailable) when nobody answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER

from bb_environments.bus.core.job_queue import HostJobQueue
from bb_environments.bus.health import BUS_UNAVAILABLE, describe
from bb_environments.bus.wire.host_protocol import (
    VERB,
    CreateJob,
    CreateReport,
    HookCancelled,
    HookJob,
    HookOutputPage,
    HookOutputRequest,
    HookRef,
    HookReport,
    HostJob,
    InputsQuery,
    NoArguments,
    ProjectQuery,
    RemoveJob,
    RemoveReport,
    StartHook,
    WorkspaceAnswer,
)
from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.handlers.ports import HostUnavailable
from bb_environments.providers.contract import CreateResult, InvalidInputs, PlanRefused, ProviderMissing, RemoveResult
from bb_environments.providers.registry import ProviderDescription
from bb_environments.providers.workspace_messages import (
    BindRequest,
    BindResult,
    CreateRequest,
    DiskUsage,
    DiskUsageRequest,
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
    "invalid_inputs": InvalidInputs,
    "plan_refused": PlanRefused,
    "provider_missing": ProviderMissing,
}


def create_operation(request: CreateRequest) -> str:
    return f"{request.environment_id}.create.{request.attempt}"


def remove_operation(request: RemoveRequest) -> str:
    if request.removal_attempt == 0:
        return f"{request.environment_id}.cleanup.{request.attempt}"
    return f"{request.environment_id}.remove.{request.removal_attempt}"


class RemoteHost:
    def __init__(self, nc: Client, jobs: HostJobQueue) -> None:
        self._nc = nc
        self._jobs = jobs

    async def providers(self, host_id: str) -> list[ProviderDescription]:
        described: list[ProviderDescription] = await self._ask(host_id, "providers", NoArguments())
        return described

    async def inputs(self, host_id: str, provider_id: str, inputs: Any) -> Any:
        return await self._ask(host_id, "inputs", InputsQuery(provider_id, inputs))

    async def canonical_project(self, host_id: str, project_path: str | None) -> str | None:
        canonical: str | None = await self._ask(host_id, "canonical-project", ProjectQuery(project_path))
        return canonical

    async def plan(self, request: PlanRequest) -> Plan:
        plan: Plan = await self._ask(request.host_id, "plan", request)
        return plan

    async def planned_path(self, request: PlanRequest) -> str | None:
        planned: str | None = await self._ask(request.host_id, "planned-path", request)
        return planned

    async def create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        """A create, once queued, runs to its end on the host; a cancelled environment then
        removes what it made (the driver's cleanup), as for a create that was past stopping. One
        that reaches the host after that removal began is refused there."""
        report: CreateReport = await self._job(request.host_id, "create", CreateJob(create_operation(request), request))
        return report.result

    async def remove(self, request: RemoveRequest, cancelled: threading.Event) -> RemoveResult:
        job = RemoveJob(remove_operation(request), request)
        report: RemoveReport = await self._job(request.host_id, "remove", job, again=request.removal_attempt == 0)
        return report.result

    async def idle_pause_due(self, host_id: str, provider_id: str, last_activity: datetime, now: datetime) -> bool:
        return False  # no provider of a host pauses: pausing is a cloud provider's, which runs in the core

    async def pause(
        self, request: ResourceRequest, checkpoint: Callable[[dict[str, Any]], Coroutine[Any, Any, object]]
    ) -> PauseResult:
        return PauseFailed(f"environments on host {request.host_id!r} do not pause")

    async def resume(self, request: ResourceRequest) -> ResumeResult:
        return ResumeFailed(f"environments on host {request.host_id!r} do not pause")

    async def survey(self, request: SurveyRequest) -> Survey:
        survey: Survey = await self._ask(request.host_id, "survey", request)
        return survey

    async def bind(self, request: BindRequest) -> BindResult:
        result: BindResult = await self._ask(request.host_id, "bind", request)
        return result

    async def remove_leftover(self, request: LeftoverRemoval) -> RemoveResult:
        result: RemoveResult = await self._ask(request.host_id, "remove-leftover", request)
        return result

    async def disk_usage(self, request: DiskUsageRequest) -> DiskUsage:
        usage: DiskUsage = await self._ask(request.host_id, "disk-usage", request)
        return usage

    async def run_hook(
        self,
        host_id: str,
        environment_id: str,
        operation_id: str,
        kind: HookKind,
        workspace: str,
        known: RecordedHook | None = None,
    ) -> HookOutcome:
        """`known` is not sent: the agent on the host asks the log itself."""
        start = StartHook(operation_id=operation_id, kind=kind, workspace=workspace, environment_id=environment_id)
        report: HookReport = await self._job(host_id, "hook", HookJob(operation_id, start))
        if report.outcome is None:
            # A refusal waits too: the agent's ledger may not have caught up with the log yet.
            raise HostUnavailable(f"the host agent of {host_id!r} answered refused: {report.refused}")
        return report.outcome

    async def cancel_hook(self, host_id: str, operation_id: str) -> str:
        cancelled: HookCancelled = await self._ask(host_id, "cancel", HookRef(operation_id))
        return cancelled.result

    async def hook_output(self, host_id: str, operation_id: str, offset: int) -> tuple[str, int, bool]:
        page: HookOutputPage = await self._ask(
            host_id, "output", HookOutputRequest(operation_id=operation_id, offset=offset)
        )
        return page.text, page.next_offset, page.more

    async def _job(self, host_id: str, name: str, job: HostJob, *, again: bool = False) -> Any:
        return await self._jobs.run(host_id, job, VERB[name].answer, again=again)

    async def _ask(self, host_id: str, name: str, body: msgspec.Struct) -> Any:
        verb = VERB[name]
        try:
            reply = await self._nc.request(verb.subject(host_id), msgspec.json.encode(body), timeout=QUERY_TIMEOUT_S)
        except BUS_UNAVAILABLE as error:
            away = await self._jobs.away(host_id, f"asking host {host_id!r} to {name}")
            raise away or HostUnavailable(f"no agent answers for host {host_id!r} ({describe(error)})") from None
        if reply.headers and (code := reply.headers.get(ERROR_CODE_HEADER)):
            raise HostUnavailable(
                f"the agent of host {host_id!r} answered {name} with {code}: {reply.headers.get(ERROR_HEADER)}"
            )
        try:
            if verb.of_hooks:
                return msgspec.json.decode(reply.data, type=verb.answer)
            answer = msgspec.json.decode(reply.data, type=WorkspaceAnswer)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise HostUnavailable(f"the agent of host {host_id!r} answered {name} with something else") from None
        if answer.refused is not None:
            raise _REFUSALS[answer.refused](answer.message or answer.refused)
        return msgspec.convert(answer.answer, verb.answer)
