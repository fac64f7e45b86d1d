"""The host agent's read-only answers about its workspaces (bb.hosts.<hostId>.workspaces.<verb>):
a plan, a planned path, inputs as a provider reads them, a canonical project, the providers, a
survey, a leftover's removal for `bb doctor --fix`. Each is the in-process port's own call on this
host's `LocalWorkspaces`; a refusal comes back by name, for the core to raise as the port would."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from bb_environments.bus.micro_requests import sent_to_endpoint
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import InputsQuery, NoArguments, ProjectQuery, WorkspaceAnswer
from bb_environments.bus.wire.refusals import refusal_reason
from bb_environments.providers.contract import InvalidInputs, PlanRefused, ProviderMissing
from bb_environments.providers.workspace_messages import LeftoverRemoval, PlanRequest, SurveyRequest
from bb_environments.providers.workspaces import LocalWorkspaces

log = logging.getLogger(__name__)
Q = TypeVar("Q")


async def add_workspace_answers(service: Service, host_id: str, workspaces: LocalWorkspaces) -> None:
    def of_this_host(call: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        async def answer(request: PlanRequest | SurveyRequest | LeftoverRemoval) -> Any:
            if request.host_id != host_id:
                raise InvalidInputs(f"host {request.host_id!r} is not this agent's ({host_id!r})")
            return await call(request)

        return answer

    async def inputs(query: InputsQuery) -> Any:
        return await workspaces.inputs(host_id, query.provider_id, query.inputs)

    async def canonical_project(query: ProjectQuery) -> Any:
        return await workspaces.canonical_project(host_id, query.project_path)

    async def providers(_: NoArguments) -> Any:
        return await workspaces.providers(host_id)

    answers: list[tuple[str, type[Any], Callable[[Any], Awaitable[Any]]]] = [
        ("plan", PlanRequest, of_this_host(workspaces.plan)),
        ("planned-path", PlanRequest, of_this_host(workspaces.planned_path)),
        ("survey", SurveyRequest, of_this_host(workspaces.survey)),
        ("remove-leftover", LeftoverRemoval, of_this_host(workspaces.remove_leftover)), ("inputs", InputsQuery, inputs),
        ("canonical-project", ProjectQuery, canonical_project), ("providers", NoArguments, providers),
    ]
    for verb, query_type, answer in answers:
        subject = subjects.host_workspaces(host_id, verb)
        await service.add_endpoint(name=f"workspaces-{verb}", subject=subject,
                                   handler=_answering(subject, query_type, answer))


def _answering(subject: str, query_type: type[Q], answer: Callable[[Q], Awaitable[Any]]
               ) -> Callable[[MicroRequest], Awaitable[None]]:
    async def reply(request: MicroRequest) -> None:
        if not sent_to_endpoint(request, subject):
            return
        try:
            query = msgspec.json.decode(request.data, type=query_type)
        except (msgspec.DecodeError, RecursionError) as malformed:
            await request.respond_error("refused", f"malformed request: {refusal_reason(malformed)}")
            return
        try:
            answered = WorkspaceAnswer(answer=msgspec.to_builtins(await answer(query)))
        except InvalidInputs as refused:
            answered = WorkspaceAnswer(refused="invalid_inputs", message=str(refused))
        except PlanRefused as refused:
            answered = WorkspaceAnswer(refused="plan_refused", message=str(refused))
        except ProviderMissing as refused:
            answered = WorkspaceAnswer(refused="provider_missing", message=str(refused))
        except Exception as error:
            log.exception("answering %s failed", subject)
            await request.respond_error("failed", str(error)[:500])
            return
        await request.respond(msgspec.json.encode(answered))

    return reply
