"""A machine's hooks, run only as the log allows: the durable hook runner behind the ledger's guard.

A hook is begun or joined once per operation id (`start_or_join`), and only while the log awaits
that operation's outcome; it is stopped only when the log no longer waits for it (`cancel`, which
writes the operation's tombstone first, so a cancelled hook can never start later, and answers
"never-started" for one that never ran here). Output lines go to the environment's transcript,
between the hook's first step (`Running`, or `Rejoined` after a restart) and its last (how it ended).
Anything the log does not back raises `HookRefused` (hooks/ledger.py).

No bus here: the agent's service (bus/agent/host_service.py) and job worker answer the bus with
it, and the core of `bb serve` calls it directly through `LocalHost` (hooks/local_host.py).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from bb_environments.domain.hook_operations import SCRIPT_NAMES, HookOutcome, RecordedHook
from bb_environments.hooks.ledger import HookGuard, HookLedger
from bb_environments.hooks.runner import BeginSink, HookBegin, HookRunner, OutputSink
from bb_environments.providers.contract import Transcript

log = logging.getLogger(__name__)

OUTPUT_PAGE_BYTES = 128 * 1024
"""Below the bus's maximum payload (1 MiB) even if JSON escapes every byte six-fold."""

HookState = tuple[str, HookOutcome | None]
"""How an operation stands here: "running", "finished" (with its outcome) or "unknown"."""


class GuardedHooks:
    def __init__(self, runner: HookRunner, host_id: str, transcript: Transcript, ledger: HookLedger) -> None:
        self._runner = runner
        self._transcript = transcript
        self._ledger = ledger
        self._host_id = host_id
        self._guard = HookGuard(ledger, host_id)
        self._running: dict[str, asyncio.Task[HookOutcome]] = {}

    async def prepare(self) -> None:
        await self._runner.prepare()  # the hook launcher is ready before the first hook

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

    async def start_or_join(
        self, operation_id: str, kind: str, environment_id: str, workspace: str, known: RecordedHook | None = None
    ) -> asyncio.Task[HookOutcome]:
        """The hook's run, begun or joined, once the guard finds the request backed by the log
        (or by `known`, see HookGuard.to_run)."""
        recorded = await self._guard.to_run(operation_id, kind, environment_id, workspace, known)
        # Asked of the log for each run, never kept: a secret set or removed since counts. Asked
        # before the check below, which no other request for the operation may pass in between.
        secrets = (
            await self._ledger.hook_secrets(operation_id, self._host_id) if operation_id not in self._running else {}
        )
        if operation_id not in self._running:
            assert recorded.workspace is not None  # an awaited hook's environment has its path
            # Begun here and now, not when a task of ours is first stepped (see HookRunner.start).
            running = self._runner.start(
                recorded.operation_id,
                recorded.kind,
                Path(recorded.workspace),
                self._output_of(recorded),
                recorded.environment_id,
                self._begin_of(recorded),
                recorded.given_variables(),
                secrets,
            )
            # Its failure is read even where the announcing task is cancelled before it awaits the
            # run (the agent's stop): the runner has recorded it, nothing else needs to.
            running.add_done_callback(_read_failure)
            self._running[operation_id] = asyncio.create_task(self._until_settled(recorded, running))
        return self._running[operation_id]

    async def state(self, operation_id: str) -> HookState:
        await self._guard.recorded(operation_id)
        if operation_id in self._running:
            return "running", None
        record = await asyncio.to_thread(self._runner.status, operation_id)
        if record is None:
            return "unknown", None
        if record.finished_at is None:
            return "running", None
        assert record.outcome is not None  # whoever finishes a record gives it its outcome in the same write
        return "finished", HookOutcome(record.outcome, record.exit_code, record.message)

    async def cancel(self, operation_id: str) -> str:
        recorded = await self._guard.to_stop(operation_id)
        return await self._runner.cancel(recorded.operation_id)

    async def output(self, operation_id: str, offset: int) -> tuple[str, int, bool]:
        """A page of the output of an operation the log recorded for this host: the text (cut
        after a whole line where one ends in it), the offset of the next page, and whether one follows."""
        await self._guard.recorded(operation_id)
        page = await asyncio.to_thread(self._runner.output_page, operation_id, max(0, offset), OUTPUT_PAGE_BYTES)
        if page is None:
            return "", offset, False
        data, _ = page
        more = len(data) == OUTPUT_PAGE_BYTES
        if more and (end_of_line := data.rfind(b"\n")) >= 0:
            data = data[: end_of_line + 1]  # a whole line, so that no character is cut in two
        return data.decode(errors="replace"), offset + len(data), more

    def _output_of(self, hook: RecordedHook) -> OutputSink:
        async def output(text: str, offset: int) -> None:
            # Named by its place in the hook's log: a restarted agent replays the log from its
            # start, and the transcripts stream drops the lines it already has.
            self._transcript.line(
                hook.environment_id, "output", hook.kind, text, message_id=f"{hook.operation_id}@{offset}"
            )

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
                outcome.status, f"{outcome.status}: {outcome.message}"
            )
            self._step(hook, f"{SCRIPT_NAMES[hook.kind]} {verdict}", "ended")
            return outcome
        finally:
            self._running.pop(hook.operation_id, None)


def _read_failure(run: asyncio.Future[HookOutcome]) -> None:
    if not run.cancelled():
        run.exception()
