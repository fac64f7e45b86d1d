"""The host agent's micro service: every query of bus/wire/host_protocol.py's VERBS, answered by
this host's `LocalHost` (its jobs are bus/agent/job_worker.py's).

A workspaces query (bb.hosts.<hostId>.workspaces.<verb>: a plan, a planned path, inputs as a
provider reads them, a canonical project, the providers, a survey, a leftover's removal for `bb
doctor --fix`) is answered in a `WorkspaceAnswer`, a refusal by name, for the core to raise as the
in-process port would. A hooks query (bb.hosts.<hostId>.hooks.<verb>) is answered as it is: `start`
begins or joins an operation and answers at once, `status` tells how it stands, `cancel` stops one
(hooks/guarded.py), `output` pages its output.

Whoever can publish on the agent's subjects is not trusted with what a request says: what the log
lets it do with a hook is decided by its guard (see hooks.ledger); a hook request the guard refuses
is answered `refused` and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from bb_environments.bus.health import BUS_UNAVAILABLE, describe
from bb_environments.bus.micro_requests import sent_to_endpoint
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import VERBS, HostVerb, WorkspaceAnswer
from bb_environments.bus.wire.refusals import refusal_reason
from bb_environments.domain.ids import quoted
from bb_environments.hooks.ledger import HookRefused
from bb_environments.hooks.local_host import LocalHost
from bb_environments.providers.contract import InvalidInputs, PlanRefused, ProviderMissing

log = logging.getLogger(__name__)

_REFUSED_BY_NAME: tuple[tuple[type[Exception], str], ...] = (
    (InvalidInputs, "invalid_inputs"),
    (PlanRefused, "plan_refused"),
    (ProviderMissing, "provider_missing"),
)


async def start_host_service(nc: Client, host_id: str, host: LocalHost) -> Service:
    """The agent's service on `nc`, its hooks' launcher ready before the first request."""
    await host.hooks.prepare()
    service = await add_service(
        nc, name=subjects.HOST_AGENT_SERVICE, version="1.0.0", description=f"hooks and workspaces on host {host_id}"
    )
    for verb in VERBS:
        if verb.kind == "query":
            subject = verb.subject(host_id)
            answering = _answering_hooks if verb.of_hooks else _answering_workspaces
            await service.add_endpoint(
                name=f"{'hooks' if verb.of_hooks else 'workspaces'}-{verb.name}",
                subject=subject,
                handler=answering(subject, verb, host_id, host),
            )
    return service


def _answering_workspaces(
    subject: str, verb: HostVerb, host_id: str, host: LocalHost
) -> Callable[[MicroRequest], Awaitable[None]]:
    async def reply(request: MicroRequest) -> None:
        if not sent_to_endpoint(request, subject):
            return
        try:
            query = msgspec.json.decode(request.data, type=verb.request)
        except (msgspec.DecodeError, RecursionError) as malformed:
            await request.respond_error("refused", f"malformed request: {refusal_reason(malformed)}")
            return
        try:
            if (named := getattr(query, "host_id", host_id)) != host_id:
                raise InvalidInputs(f"host {named!r} is not this agent's ({host_id!r})")
            answered = WorkspaceAnswer(answer=msgspec.to_builtins(await verb.answered_by(host, host_id, query)))
        except (InvalidInputs, PlanRefused, ProviderMissing) as refused:
            name = next(name for kind, name in _REFUSED_BY_NAME if isinstance(refused, kind))
            answered = WorkspaceAnswer(refused=name, message=str(refused))  # type: ignore[arg-type]
        except Exception as error:
            log.exception("answering %s failed", subject)
            await request.respond_error("failed", str(error)[:500])
            return
        await request.respond(msgspec.json.encode(answered))

    return reply


def _answering_hooks(
    subject: str, verb: HostVerb, host_id: str, host: LocalHost
) -> Callable[[MicroRequest], Awaitable[None]]:
    async def reply(request: MicroRequest) -> None:
        if not sent_to_endpoint(request, subject):
            return
        try:
            answer: Any = await verb.answered_by(host, host_id, _decoded(request.data, verb.request))
        except HookRefused as refused:
            # %r: ids and paths come from whoever sent the request; they must not forge log lines.
            log.warning(
                "refused %s for operation %s: %s",
                request.subject,
                quoted(refused.operation_id) if refused.operation_id is not None else None,
                refused.reason,
            )
            await request.respond_error("refused", refused.reason.replace("\n", " ")[:500])
            return
        except BUS_UNAVAILABLE as away:
            # The guard could not ask the core's log (a core or a node away): nothing was done,
            # and the core, told so, asks again as it does while a host is away.
            log.warning("%s waits for the core's log: %s", request.subject, describe(away))
            await request.respond_error("unavailable", f"the core's log did not answer ({describe(away)})")
            return
        except Exception as error:
            log.exception("host agent request on %s failed", request.subject)
            await request.respond_error("failed", str(error)[:500])
            return
        await request.respond(msgspec.json.encode(answer))

    return reply


def _decoded(data: bytes, request_type: Any) -> Any:
    try:
        return msgspec.json.decode(data, type=request_type)
    except (msgspec.DecodeError, RecursionError) as malformed:
        # Without the request's text: an unknown field's name could carry a line break into our log.
        raise HookRefused(None, f"malformed request: {refusal_reason(malformed)}") from None
