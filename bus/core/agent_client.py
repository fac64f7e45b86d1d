"""The core's side of the host agents: run a hook on a host and learn its outcome.

Hooks on the host of the agent in this process go to it directly (`LocalFirstHooks`); every other
host's go over the bus (`HostAgentClient`), queued for that host's agent however long it is away.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER

from bb_environments.bus.agent.host_service import HostAgent
from bb_environments.bus.core.job_queue import HostJobs
from bb_environments.bus.health import BUS_UNAVAILABLE, describe
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import (
    HookCancelled, HookJob, HookOutputPage, HookOutputRequest, HookRef, HookReport, StartHook)
from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.handlers.ports import HostUnavailable
from bb_environments.hooks.ledger import HookRefused

T = TypeVar("T")

class LocalFirstHooks:
    """Hooks on the host of the agent in this process go to that agent directly, once it is
    attached: the same guard, the same durable runner, without a request over the bus and a
    `finished` message to wait for (two round trips on the way to `ready`). Other hosts' hooks, and
    this host's before its agent is attached, go over the bus."""

    def __init__(self, host_id: str, remote: HostAgentClient) -> None:
        self._host_id = host_id
        self._remote = remote
        self._agent: HostAgent | None = None

    def attach(self, agent: HostAgent) -> None:
        self._agent = agent

    async def run(self, host_id: str, environment_id: str, operation_id: str, kind: HookKind,
                  workspace: str, known: RecordedHook | None = None) -> HookOutcome:
        if self._agent is None or host_id != self._host_id:
            return await self._remote.run(host_id, environment_id, operation_id, kind, workspace)
        start = StartHook(operation_id=operation_id, kind=kind, workspace=workspace, environment_id=environment_id)
        try:
            # The core's own answer from the log: no second trip to the store's writer to read it.
            running = await self._agent.start_or_join(start, known)
        except HookRefused as refused:
            raise _unavailable(host_id, "refused", refused.reason) from None
        # Shielded: the core giving up on waiting (a stop) must not cancel the agent's run.
        return await asyncio.shield(running)

    async def cancel(self, host_id: str, operation_id: str) -> str:
        if self._agent is None or host_id != self._host_id:
            return await self._remote.cancel(host_id, operation_id)
        try:
            return await self._agent.cancel_hook(operation_id)
        except HookRefused as refused:
            raise _unavailable(host_id, "refused", refused.reason) from None


    async def output(self, host_id: str, operation_id: str, offset: int) -> tuple[str, int, bool]:
        if self._agent is None or host_id != self._host_id:
            return await self._remote.output(host_id, operation_id, offset)
        try:
            page = await self._agent.hook_output(operation_id, offset)
        except HookRefused as refused:
            raise _unavailable(host_id, "refused", refused.reason) from None
        return page.text, page.next_offset, page.more


class HostAgentClient:
    """The core's side for hosts whose agent is elsewhere: a hook is a job queued for the host
    (bus/core/job_queue.py), waited for however long it takes; stopping one is a request the
    agent answers at once."""

    def __init__(self, nc: Client, jobs: HostJobs) -> None:
        self._nc = nc
        self._jobs = jobs

    async def run(self, host_id: str, environment_id: str, operation_id: str, kind: HookKind,
                  workspace: str, known: RecordedHook | None = None) -> HookOutcome:
        """`known` is not sent: the agent on the host asks the log itself."""
        start = StartHook(operation_id=operation_id, kind=kind, workspace=workspace, environment_id=environment_id)
        report = await self._jobs.run(host_id, HookJob(operation_id, start), HookReport)
        if report.outcome is None:
            raise _unavailable(host_id, "refused", report.refused)
        return report.outcome

    async def cancel(self, host_id: str, operation_id: str) -> str:
        try:
            reply = await self._ask(host_id, "cancel", HookRef(operation_id))
        except BUS_UNAVAILABLE as error:
            raise HostUnavailable(f"no host agent answers for host {host_id!r} ({describe(error)})") from None
        return _answer(reply, host_id, HookCancelled).result

    async def output(self, host_id: str, operation_id: str, offset: int) -> tuple[str, int, bool]:
        try:
            reply = await self._ask(host_id, "output", HookOutputRequest(operation_id=operation_id, offset=offset))
        except BUS_UNAVAILABLE as error:
            raise HostUnavailable(f"no host agent answers for host {host_id!r} ({describe(error)})") from None
        page = _answer(reply, host_id, HookOutputPage)
        return page.text, page.next_offset, page.more

    async def _ask(self, host_id: str, verb: str, body: msgspec.Struct) -> Msg:
        return await self._nc.request(subjects.host_hooks(host_id, verb), msgspec.json.encode(body), timeout=10)


def _answer(reply: Msg, host_id: str, answer: type[T]) -> T:
    if reply.headers and (code := reply.headers.get(ERROR_CODE_HEADER)):
        raise _unavailable(host_id, code, reply.headers.get(ERROR_HEADER))
    return msgspec.json.decode(reply.data, type=answer)


def _unavailable(host_id: str, code: str, reason: str | None) -> HostUnavailable:
    # A refusal too: the agent's ledger may not have caught up with the log yet.
    return HostUnavailable(f"the host agent of {host_id!r} answered {code}: {reason}")
