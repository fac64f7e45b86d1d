"""The host agent on NATS: runs a machine's hooks for the core, and the core's client for it.

The agent (a micro service per host, `bb.hosts.<hostId>.hooks.*`) wraps the durable hook runner:
`start` begins or joins an operation and answers at once; the outcome is published on the
operation's `finished` subject, and `status` answers it again for a caller that missed it.
`cancel` writes the operation's tombstone first, so a cancelled hook can never start later, and
answers "never-started" for an operation it does not know, so cleanup is never blocked by it.
Output lines go straight to the environment's transcript. In the embedded default the agent for
host `local` runs inside `bb serve`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.micro import add_service
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from bus import subjects
from bus.transcripts import TranscriptPublisher
from providers.host.hooks import HookOutcome, HookRunner

log = logging.getLogger(__name__)
T = TypeVar("T")

STATUS_POLL_S = 5.0


class StartHook(msgspec.Struct, rename="camel", kw_only=True):
    operation_id: str
    kind: Literal["setup", "teardown"]
    workspace: str
    environment_id: str


class HookRef(msgspec.Struct, rename="camel"):
    operation_id: str


class HookState(msgspec.Struct, rename="camel", kw_only=True):
    state: Literal["running", "finished", "unknown"]
    outcome: HookOutcome | None = None


class Cancelled(msgspec.Struct, rename="camel"):
    result: str


class HostUnavailable(Exception):
    """No agent answers for the host: the hook step waits and is asked again later."""


class HostAgent:
    def __init__(self, nc: Client, runner: HookRunner, host_id: str, transcript: TranscriptPublisher) -> None:
        self._nc = nc
        self._runner = runner
        self._host_id = host_id
        self._transcript = transcript
        self._running: dict[str, asyncio.Task[HookOutcome]] = {}

    async def start(self) -> Service:
        await self._runner.prepare()  # the hook launcher is ready before the first hook
        service = await add_service(self._nc, name=subjects.HOST_AGENT_SERVICE, version="1.0.0",
                                    description=f"hooks on host {self._host_id}")
        for verb, handler in (("start", self._start), ("status", self._status), ("cancel", self._cancel)):
            await service.add_endpoint(name=f"hooks-{verb}", subject=subjects.host_hooks(self._host_id, verb),
                                       handler=_replying(handler))
        return service

    async def stop(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._runner.close()

    async def _start(self, data: bytes) -> HookState:
        request = msgspec.json.decode(data, type=StartHook)
        if request.operation_id not in self._running:
            self._running[request.operation_id] = asyncio.create_task(self._run(request))
        return HookState(state="running")

    async def _run(self, request: StartHook) -> HookOutcome:
        async def output(text: str, offset: int) -> None:
            # Named by its place in the hook's log: a restarted agent replays the log from its
            # start, and the transcripts stream drops the lines it already has.
            self._transcript.line(request.environment_id, "output", request.kind, text,
                                  message_id=f"{request.operation_id}@{offset}")

        try:
            outcome = await self._runner.run(request.operation_id, request.kind, Path(request.workspace), output)
            finished = HookState(state="finished", outcome=outcome)
            await self._nc.publish(subjects.hook_finished(self._host_id, request.operation_id),
                                   msgspec.json.encode(finished))
            return outcome
        finally:
            self._running.pop(request.operation_id, None)

    async def _status(self, data: bytes) -> HookState:
        operation_id = msgspec.json.decode(data, type=HookRef).operation_id
        if operation_id in self._running:
            return HookState(state="running")
        record = await asyncio.to_thread(self._runner.status, operation_id)
        if record is None:
            return HookState(state="unknown")
        if record.finished_at is None:
            return HookState(state="running")
        return HookState(state="finished", outcome=HookOutcome(record.outcome, record.exit_code, record.message))

    async def _cancel(self, data: bytes) -> Cancelled:
        return Cancelled(await self._runner.cancel(msgspec.json.decode(data, type=HookRef).operation_id))


def _replying(handler: Callable[[bytes], Awaitable[msgspec.Struct]]) -> Callable[[MicroRequest], Awaitable[None]]:
    async def reply(request: MicroRequest) -> None:
        try:
            answer = await handler(request.data)
        except Exception as error:
            log.exception("host agent request on %s failed", request.subject)
            await request.respond_error("failed", str(error)[:500])
            return
        await request.respond(msgspec.json.encode(answer))

    return reply


class HostAgentClient:
    """The core's side: run a hook on a host and wait for its outcome, however long it takes."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc

    async def run(self, host_id: str, environment_id: str, operation_id: str, kind: str, workspace: str) -> HookOutcome:
        finished = asyncio.get_running_loop().create_future()

        async def on_finished(message) -> None:
            if not finished.done():
                finished.set_result(msgspec.json.decode(message.data, type=HookState))

        subscription = await self._nc.subscribe(subjects.hook_finished(host_id, operation_id), cb=on_finished)
        try:
            start = StartHook(operation_id=operation_id, kind=kind, workspace=workspace, environment_id=environment_id)
            state = await self._request(host_id, "start", start, HookState)
            while state.state != "finished":
                try:
                    state = await asyncio.wait_for(asyncio.shield(finished), STATUS_POLL_S)
                except asyncio.TimeoutError:
                    # The finished message may have been lost (a reconnect): ask for the state again.
                    state = await self._request(host_id, "status", HookRef(operation_id), HookState)
                    if state.state == "unknown":
                        state = await self._request(host_id, "start", start, HookState)
            assert state.outcome is not None
            return state.outcome
        finally:
            await subscription.unsubscribe()

    async def cancel(self, host_id: str, operation_id: str) -> str:
        return (await self._request(host_id, "cancel", HookRef(operation_id), Cancelled)).result

    async def _request(self, host_id: str, verb: str, body: msgspec.Struct, answer: type[T]) -> T:
        try:
            reply = await self._nc.request(subjects.host_hooks(host_id, verb), msgspec.json.encode(body), timeout=10)
        except (NoRespondersError, NatsTimeout) as error:
            raise HostUnavailable(f"no host agent answers for host {host_id!r} ({type(error).__name__})") from None
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            raise HostUnavailable(f"the host agent of {host_id!r} failed: {reply.headers.get('Nats-Service-Error')}")
        return msgspec.json.decode(reply.data, type=answer)
