"""The core's side of the host agents: run a hook on a host and learn its outcome.

Hooks on the host of the agent in this process go to it directly (`LocalFirstHooks`); every other
host's go over the bus (`HostAgentClient`), which waits however long the hook takes, and however
long the bus between them is away meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER

from bb_environments.bus.agent.host_agent import HostAgent
from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth, Retry, describe
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_messages import HookCancelled, HookRef, HookState, StartHook
from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.handlers.ports import HostUnavailable
from bb_environments.hooks.ledger import HookRefused

T = TypeVar("T")

STATUS_POLL_S = 5.0


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


class HostAgentClient:
    """The core's side: run a hook on a host and wait for its outcome, however long it takes, and
    however long the bus between them is away meanwhile."""

    def __init__(self, nc: Client, *, health: BusHealth | None = None) -> None:
        self._nc = nc
        self._health = health or BusHealth()

    async def run(self, host_id: str, environment_id: str, operation_id: str, kind: HookKind,
                  workspace: str, known: RecordedHook | None = None) -> HookOutcome:
        """`known` is not sent: the agent on the host asks its own ledger."""
        bus = self._health.retry(f"the {kind} hook {operation_id} on host {host_id!r}")
        finished = asyncio.get_running_loop().create_future()
        finished_subject = subjects.hook_finished(host_id, operation_id)

        async def on_finished(message: Msg) -> None:
            # Only what the agent published: a copy a client's JetStream consumer pushed here keeps
            # the subject it was stored under (see bus/micro_requests.py).
            if message.subject == finished_subject and not finished.done():
                finished.set_result(msgspec.json.decode(message.data, type=HookState))

        subscription = await self._nc.subscribe(finished_subject, cb=on_finished)
        try:
            start = StartHook(operation_id=operation_id, kind=kind, workspace=workspace, environment_id=environment_id)
            state = await self._until_answered(bus, host_id, "start", start, HookState)
            while state.state != "finished":
                try:
                    state = await asyncio.wait_for(asyncio.shield(finished), STATUS_POLL_S)
                except asyncio.TimeoutError:
                    # The finished message may have been lost (a reconnect): ask for the state again.
                    state = await self._until_answered(bus, host_id, "status", HookRef(operation_id), HookState)
                    if state.state == "unknown":
                        state = await self._until_answered(bus, host_id, "start", start, HookState)
            assert state.outcome is not None
            return state.outcome
        finally:
            await subscription.unsubscribe()

    async def cancel(self, host_id: str, operation_id: str) -> str:
        try:
            reply = await self._ask(host_id, "cancel", HookRef(operation_id))
        except BUS_UNAVAILABLE as error:
            raise HostUnavailable(f"no host agent answers for host {host_id!r} ({describe(error)})") from None
        return _answer(reply, host_id, HookCancelled).result

    async def _until_answered(self, bus: Retry, host_id: str, verb: str, body: msgspec.Struct, answer: type[T]) -> T:
        """Asked again after a growing pause for as long as the bus, or the agent on it, is away:
        the hook runs on meanwhile, and is joined afterwards, not started again."""
        while True:
            try:
                reply = await self._ask(host_id, verb, body)
            except BUS_UNAVAILABLE as error:
                await bus.pause(error)
                continue
            bus.succeeded()
            return _answer(reply, host_id, answer)

    async def _ask(self, host_id: str, verb: str, body: msgspec.Struct) -> Msg:
        return await self._nc.request(subjects.host_hooks(host_id, verb), msgspec.json.encode(body), timeout=10)


def _answer(reply: Msg, host_id: str, answer: type[T]) -> T:
    if reply.headers and (code := reply.headers.get(ERROR_CODE_HEADER)):
        raise _unavailable(host_id, code, reply.headers.get(ERROR_HEADER))
    return msgspec.json.decode(reply.data, type=answer)


def _unavailable(host_id: str, code: str, reason: str | None) -> HostUnavailable:
    # A refusal too: the agent's ledger may not have caught up with the log yet.
    return HostUnavailable(f"the host agent of {host_id!r} answered {code}: {reason}")
