"""The host agent on NATS: runs a machine's hooks for the core (its client: bus/core/agent_client.py).

The agent (a micro service per host, `bb.hosts.<hostId>.hooks.*`) wraps the durable hook runner:
`start` begins or joins an operation and answers at once, and `status` tells how it stands; the
core queues a remote host's hooks as jobs instead (bus/agent/job_worker.py), which join the same run.
`cancel` writes the operation's tombstone first, so a cancelled hook can never start later, and
answers "never-started" for an operation that never ran here, so cleanup is never blocked by it.
Output lines go straight to the environment's transcript, between the hook's first step (`Running`,
or `Rejoined` after a restart) and its last (how it ended), which the agent writes too. In the embedded default the agent for
host `local` runs inside `bb serve`, and the core hands it that host's hooks directly
(`LocalFirstHooks`), through the same guard.

Whoever can publish on the agent's subjects is not trusted with what a request says: what the log
lets it do is decided by its guard (see hooks.ledger); a request the guard refuses is answered
`refused` and logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.refusals import refusal_reason
from bb_environments.bus.micro_requests import sent_to_endpoint
from bb_environments.bus.transcript_publisher import TranscriptPublisher
from bb_environments.bus.wire.host_protocol import (
    HookCancelled, HookOutputPage, HookOutputRequest, HookRef, HookState, StartHook)
from bb_environments.domain.hook_operations import SCRIPT_NAMES, HookOutcome, RecordedHook
from bb_environments.domain.ids import quoted
from bb_environments.hooks.ledger import HookGuard, HookLedger, HookRefused
from bb_environments.hooks.runner import BeginSink, HookBegin, HookRunner, OutputSink

log = logging.getLogger(__name__)
T = TypeVar("T")

OUTPUT_PAGE_BYTES = 128 * 1024
"""Below the bus's maximum payload (1 MiB) even if JSON escapes every byte six-fold."""


class HostAgent:
    def __init__(self, nc: Client, runner: HookRunner, host_id: str, transcript: TranscriptPublisher,
                 ledger: HookLedger) -> None:
        self._nc = nc
        self._runner = runner
        self._host_id = host_id
        self._transcript = transcript
        self._guard = HookGuard(ledger, host_id)
        self._running: dict[str, asyncio.Task[HookOutcome]] = {}

    async def start(self) -> Service:
        await self._runner.prepare()  # the hook launcher is ready before the first hook
        service = await add_service(self._nc, name=subjects.HOST_AGENT_SERVICE, version="1.0.0",
                                    description=f"hooks on host {self._host_id}")
        for verb, handler in (("start", self._start), ("status", self._status), ("cancel", self._cancel),
                              ("output", self._output)):
            subject = subjects.host_hooks(self._host_id, verb)
            await service.add_endpoint(name=f"hooks-{verb}", subject=subject, handler=_replying(subject, handler))
        return service

    async def stop(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._runner.close()

    async def forget_removed(self, max_age_s: float) -> None:
        """Delete the hook records the retention rule lets go (see hooks.ledger)."""
        try:
            forgotten = await self._guard.forget_removed(self._runner, max_age_s)
        except Exception:
            # Not worth stopping the sweep that calls this: the next one tries again.
            log.exception("deleting the hook records of removed environments failed")
            return
        if forgotten:
            log.info("deleted the records of %d hook operations of removed environments", len(forgotten))

    async def _start(self, data: bytes) -> HookState:
        await self.start_or_join(_decode(data, StartHook))
        return HookState(state="running")

    async def start_or_join(self, request: StartHook, known: RecordedHook | None = None) -> asyncio.Task[HookOutcome]:
        """The hook's run, begun or joined, once the guard finds the request backed by the log
        (or by `known`, see HookGuard.to_run)."""
        recorded = await self._guard.to_run(request.operation_id, request.kind, request.environment_id,
                                            request.workspace, known)
        if request.operation_id not in self._running:
            assert recorded.workspace is not None  # an awaited hook's environment has its path
            # Begun here and now, not when a task of ours is first stepped (see HookRunner.start).
            running = self._runner.start(recorded.operation_id, recorded.kind, Path(recorded.workspace),
                                         self._output_of(recorded), recorded.environment_id,
                                         self._begin_of(recorded))
            # Its failure is read even where the announcing task is cancelled before it awaits the
            # run (the agent's stop): the runner has recorded it, nothing else needs to.
            running.add_done_callback(_read_failure)
            self._running[request.operation_id] = asyncio.create_task(self._until_settled(recorded, running))
        return self._running[request.operation_id]

    def _output_of(self, hook: RecordedHook) -> OutputSink:
        async def output(text: str, offset: int) -> None:
            # Named by its place in the hook's log: a restarted agent replays the log from its
            # start, and the transcripts stream drops the lines it already has.
            self._transcript.line(hook.environment_id, "output", hook.kind, text,
                                  message_id=f"{hook.operation_id}@{offset}")

        return output

    def _begin_of(self, hook: RecordedHook) -> BeginSink:
        """The transcript's step before the hook's output: here, on the connection its output goes
        out on, so that it comes first. A hook a restarted agent joins says so rather than looking
        as if it ran twice; one it finds finished (its outcome not yet recorded by the core) adds
        nothing before the output the stream already has."""
        script = SCRIPT_NAMES[hook.kind]

        def begun(how: HookBegin) -> None:
            if how == "started":
                self._step(hook, f"Running {script}", "started")
            elif how == "rejoined":
                self._step(hook, f"Rejoined {script}, which kept running across a restart", "rejoined")

        return begun

    def _step(self, hook: RecordedHook, text: str, moment: str) -> None:
        # Named too: said again after a restart within the stream's duplicate window, it is dropped.
        self._transcript.line(hook.environment_id, "step", hook.kind, text, message_id=f"{hook.operation_id}@{moment}")

    async def _until_settled(self, hook: RecordedHook, running: asyncio.Future[HookOutcome]) -> HookOutcome:
        """The run's outcome, once it has one, with its step in the transcript after the hook's
        last output line (the runner delivers every line before the outcome)."""
        try:
            outcome = await running
            verdict = {"succeeded": "finished", "skipped": "skipped: the workspace has none"}.get(
                outcome.status, f"{outcome.status}: {outcome.message}")
            self._step(hook, f"{SCRIPT_NAMES[hook.kind]} {verdict}", "ended")
            return outcome
        finally:
            self._running.pop(hook.operation_id, None)

    async def _status(self, data: bytes) -> HookState:
        operation_id = _decode(data, HookRef).operation_id
        await self._guard.recorded(operation_id)
        if operation_id in self._running:
            return HookState(state="running")
        record = await asyncio.to_thread(self._runner.status, operation_id)
        if record is None:
            return HookState(state="unknown")
        if record.finished_at is None:
            return HookState(state="running")
        assert record.outcome is not None  # whoever finishes a record gives it its outcome in the same write
        return HookState(state="finished", outcome=HookOutcome(record.outcome, record.exit_code, record.message))

    async def _cancel(self, data: bytes) -> HookCancelled:
        return HookCancelled(await self.cancel_hook(_decode(data, HookRef).operation_id))

    async def cancel_hook(self, operation_id: str) -> str:
        recorded = await self._guard.to_stop(operation_id)
        return await self._runner.cancel(recorded.operation_id)

    async def _output(self, data: bytes) -> HookOutputPage:
        asked = _decode(data, HookOutputRequest)
        return await self.hook_output(asked.operation_id, asked.offset)

    async def hook_output(self, operation_id: str, offset: int) -> HookOutputPage:
        """A page of the output of an operation the log recorded for this host."""
        await self._guard.recorded(operation_id)
        page = await asyncio.to_thread(self._runner.output_page, operation_id, max(0, offset), OUTPUT_PAGE_BYTES)
        if page is None:
            return HookOutputPage(text="", next_offset=offset, more=False)
        data, _ = page
        more = len(data) == OUTPUT_PAGE_BYTES
        if more and (end_of_line := data.rfind(b"\n")) >= 0:
            data = data[:end_of_line + 1]  # a whole line, so that no character is cut in two
        return HookOutputPage(text=data.decode(errors="replace"), next_offset=offset + len(data), more=more)


def _read_failure(run: asyncio.Future[HookOutcome]) -> None:
    if not run.cancelled():
        run.exception()


def _decode(data: bytes, request_type: type[T]) -> T:
    try:
        return msgspec.json.decode(data, type=request_type)
    except (msgspec.DecodeError, RecursionError) as malformed:
        # Without the request's text: an unknown field's name could carry a line break into our log.
        raise HookRefused(None, f"malformed request: {refusal_reason(malformed)}") from None


def _replying(subject: str, handler: Callable[[bytes], Awaitable[msgspec.Struct]]
              ) -> Callable[[MicroRequest], Awaitable[None]]:
    async def reply(request: MicroRequest) -> None:
        if not sent_to_endpoint(request, subject):
            return
        try:
            answer = await handler(request.data)
        except HookRefused as refused:
            # %r: ids and paths come from whoever sent the request; they must not forge log lines.
            log.warning("refused %s for operation %s: %s", request.subject,
                        quoted(refused.operation_id) if refused.operation_id is not None else None, refused.reason)
            await request.respond_error("refused", refused.reason.replace("\n", " ")[:500])
            return
        except Exception as error:
            log.exception("host agent request on %s failed", request.subject)
            await request.respond_error("failed", str(error)[:500])
            return
        await request.respond(msgspec.json.encode(answer))

    return reply
