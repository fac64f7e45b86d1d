"""Running a workspace's setup/teardown hook at most once per operation id.

Each hook runs under `providers.host.hook_supervisor`, a process in its own session that outlives
this service and writes the script's outcome into the operation's durable record. So after a
restart a hook still running is joined and its real outcome read back; only when the supervisor
itself has died is the outcome unknown ("interrupted").

This process assumes it is the only service using its records directory: a record whose
supervisor was never adopted (see hook_supervisor) is only waited on while this process's own run
of that operation is in flight.

Output lines are delivered through `on_output` at most once per process: each process remembers
how far into an operation's log it has delivered. A process that replays or joins an operation
it has not seen before delivers the log from its start, so a consumer may see lines again after a
restart.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import msgspec

from providers.host.hook_records import (
    HookIdentityMismatch,
    HookKind,
    HookRecord,
    HookRecords,
    is_same_process,
    kill_recorded_group,
    now_iso,
    process_start_ticks,
    signal_recorded_process,
)

SCRIPT_NAMES: dict[str, str] = {"setup": ".bb-env-setup.sh", "teardown": ".bb-env-teardown.sh"}
POLL_S = 0.02
CANCEL_WAIT_S = 10.0
SUPERVISOR_EXIT_WAIT_S = 2.0
SUPERVISOR_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from providers.host.hook_supervisor import main; main()"
)
# The directory that holds the `providers` package, so `-m` finds it whatever our cwd is.
IMPORT_ROOT = Path(__file__).resolve().parents[2]

HookStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "skipped", "interrupted"]
CancelResult = Literal["never-started", "finished", "terminated"]
OutputSink = Callable[[str], Awaitable[None]]


class HookOutcome(msgspec.Struct, frozen=True):
    status: HookStatus
    exit_code: int | None = None
    message: str | None = None


CANCELLED_BEFORE_START = HookOutcome("cancelled", None, "cancelled before it started")


@dataclass
class _InFlight:
    task: asyncio.Task[HookOutcome]
    kind: str
    workspace: str


class HookRunner:
    def __init__(self, records_dir: Path, timeout_s: float) -> None:
        self._records = HookRecords(records_dir)
        self._timeout_s = timeout_s
        self._in_flight: dict[str, _InFlight] = {}
        self._delivered_offsets: dict[str, int] = {}
        self._finalize_locks: dict[str, asyncio.Lock] = {}

    def status(self, operation_id: str) -> HookRecord | None:
        return self._records.read(operation_id)

    async def run(self, operation_id: str, kind: str, workspace: Path, on_output: OutputSink) -> HookOutcome:
        """Run the hook once; a repeated or concurrent call for the same operation gets its outcome.

        A concurrent second call waits for the first one's outcome; only the first call's
        `on_output` receives the lines.
        """
        if kind not in SCRIPT_NAMES:
            raise ValueError(f"unknown hook kind {kind!r}")
        workspace = Path(workspace)
        in_flight = self._in_flight.get(operation_id)
        if in_flight is None:
            task = asyncio.ensure_future(self._run_once(operation_id, kind, workspace, on_output))
            in_flight = _InFlight(task=task, kind=kind, workspace=str(workspace))
            self._in_flight[operation_id] = in_flight
            task.add_done_callback(lambda _: self._in_flight.pop(operation_id, None))
        elif (in_flight.kind, in_flight.workspace) != (kind, str(workspace)):
            raise HookIdentityMismatch(f"operation {operation_id!r} is already running another hook")
        # Shielded: a caller that stops waiting must not stop the hook's bookkeeping midway.
        return await asyncio.shield(in_flight.task)

    async def cancel(self, operation_id: str) -> CancelResult:
        """Make sure the hook never starts, or stop it; returns what there was to stop."""
        await asyncio.to_thread(self._records.tombstone, operation_id)
        record = await self._record_once_adopted(operation_id)
        return await self._stop(record)

    async def _run_once(
        self, operation_id: str, kind: str, workspace: Path, on_output: OutputSink
    ) -> HookOutcome:
        record = await asyncio.to_thread(self._records.read, operation_id)
        if record is not None:
            _check_identity(record, kind, workspace)
        if await asyncio.to_thread(self._records.is_tombstoned, operation_id):
            return await self._settle_cancelled(record)
        if record is not None:
            return _outcome(await self._follow(record, on_output))
        record, supervisor = await self._start(operation_id, cast(HookKind, kind), workspace)
        record = await self._follow(record, on_output, supervisor)
        if supervisor is not None:
            await asyncio.to_thread(supervisor.wait)
        return _outcome(record)

    async def _settle_cancelled(self, record: HookRecord | None) -> HookOutcome:
        """A tombstoned operation: stop whatever a cancel interrupted by a crash left running."""
        if record is None:
            return CANCELLED_BEFORE_START
        await self._stop(record)
        settled = await asyncio.to_thread(self._records.read, record.operation_id)
        if settled is not None and settled.outcome == "cancelled":
            return _outcome(settled)
        return HookOutcome("cancelled", None, "the operation was cancelled")

    async def _start(
        self, operation_id: str, kind: HookKind, workspace: Path
    ) -> tuple[HookRecord, subprocess.Popen[bytes] | None]:
        """Write the fresh record and start its supervisor; a missing script is recorded as skipped."""
        script = workspace / SCRIPT_NAMES[kind]
        record = HookRecord(
            operation_id=operation_id, kind=kind, workspace=str(workspace), script=str(script), started_at=now_iso()
        )
        if not await asyncio.to_thread(script.is_file):
            record.finished_at = record.started_at
            record.outcome = "skipped"
            record.message = f"{script.name} not found"
            await asyncio.to_thread(self._records.write, record)
            return record, None
        await asyncio.to_thread(self._records.write, record)
        # Popen, not asyncio's subprocess: closing or collecting an asyncio subprocess transport
        # kills a child still running, and the supervisor must outlive this service.
        supervisor = await asyncio.to_thread(
            subprocess.Popen,
            self._supervisor_command(operation_id),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=IMPORT_ROOT,
        )
        # Adoption: the supervisor waits for its own identity in the record before it starts.
        record.supervisor_pid = supervisor.pid
        record.supervisor_started_at = process_start_ticks(supervisor.pid)
        await asyncio.to_thread(self._records.write, record)
        return record, supervisor

    def _supervisor_command(self, operation_id: str) -> list[str]:
        # -I -S: no site-packages, no user paths; the supervisor needs only the standard library
        # and starts in a few milliseconds instead of a hundred.
        return [sys.executable, "-I", "-S", "-c", SUPERVISOR_BOOTSTRAP, str(IMPORT_ROOT),
                str(self._records.directory), operation_id, repr(self._timeout_s)]

    async def _follow(
        self, record: HookRecord, on_output: OutputSink, supervisor: subprocess.Popen[bytes] | None = None
    ) -> HookRecord:
        """Deliver the log as it grows until the record is finished.

        With the supervisor as our own child, its exit (which follows its last record write) ends
        the wait at once; otherwise its liveness is polled.
        """
        operation_id = record.operation_id
        while record.finished_at is None:
            await self._deliver_log(operation_id, on_output, complete=False)
            if supervisor is not None:
                await asyncio.to_thread(_wait_for_exit, supervisor, POLL_S)
            elif not await asyncio.to_thread(_supervisor_alive, record):
                record = await self._close_orphaned(operation_id)
                break
            else:
                await asyncio.sleep(POLL_S)
            record = await self._read_existing(operation_id)
            if record.finished_at is None and supervisor is not None and supervisor.poll() is not None:
                record = await self._close_orphaned(operation_id)
        await self._deliver_log(operation_id, on_output, complete=True)
        return record

    async def _deliver_log(self, operation_id: str, on_output: OutputSink, complete: bool) -> None:
        """Send the lines this process has not delivered yet; a partial last line only once complete."""
        offset = self._delivered_offsets.get(operation_id, 0)
        data = await asyncio.to_thread(_read_from, self._records.log_path(operation_id), offset)
        if not complete:
            data = data[: data.rfind(b"\n") + 1]
        for line in data.splitlines(keepends=True):
            self._delivered_offsets[operation_id] = offset = offset + len(line)
            await on_output(line.rstrip(b"\r\n").decode("utf-8", errors="replace"))

    async def _record_once_adopted(self, operation_id: str) -> HookRecord | None:
        """The record, after this process's own in-flight run has recorded its supervisor."""
        while True:
            record = await asyncio.to_thread(self._records.read, operation_id)
            starting = record is not None and record.finished_at is None and record.supervisor_pid is None
            if not (starting and operation_id in self._in_flight):
                return record
            await asyncio.sleep(POLL_S)

    async def _stop(self, record: HookRecord | None) -> CancelResult:
        if record is None:
            return "never-started"
        if record.finished_at is not None:
            return "finished"
        operation_id = record.operation_id
        if signal_recorded_process(record.supervisor_pid, record.supervisor_started_at, signal.SIGTERM):
            record = await self._wait_until_finished(operation_id, CANCEL_WAIT_S)
            unresponsive = record.finished_at is None
            if unresponsive and signal_recorded_process(record.supervisor_pid, record.supervisor_started_at, signal.SIGKILL):
                await self._wait_until_finished(operation_id, SUPERVISOR_EXIT_WAIT_S)
        record = await self._close_orphaned(operation_id)
        if record.outcome != "cancelled":
            return "finished"
        return "terminated" if record.script_pid is not None else "never-started"

    async def _wait_until_finished(self, operation_id: str, timeout_s: float) -> HookRecord:
        """The record once finished, its supervisor gone, or the time is up."""
        deadline = time.monotonic() + timeout_s
        record = await self._read_existing(operation_id)
        while record.finished_at is None and time.monotonic() < deadline:
            if not await asyncio.to_thread(_supervisor_alive, record):
                break
            await asyncio.sleep(POLL_S)
            record = await self._read_existing(operation_id)
        return record

    async def _close_orphaned(self, operation_id: str) -> HookRecord:
        """Finish a record whose supervisor is dead, killing the script's group if it lives on.

        Callers have seen the supervisor dead (or killed it); the lock keeps a concurrent cancel
        and run from closing the same record twice.
        """
        async with self._finalize_locks.setdefault(operation_id, asyncio.Lock()):
            record = await self._read_existing(operation_id)
            if record.finished_at is not None:
                return record
            confirmed = await asyncio.to_thread(kill_recorded_group, record.script_pid, record.script_started_at)
            name = Path(record.script).name
            if await asyncio.to_thread(self._records.is_tombstoned, operation_id):
                record.outcome, record.message = "cancelled", f"{name} cancelled"
            else:
                record.outcome = "interrupted"
                record.message = f"{name} was interrupted: its supervisor stopped before recording the outcome"
            if not confirmed:
                record.message += "; some of its processes could not be confirmed stopped"
            record.finished_at = now_iso()
            await asyncio.to_thread(self._records.write, record)
            return record

    async def _read_existing(self, operation_id: str) -> HookRecord:
        record = await asyncio.to_thread(self._records.read, operation_id)
        if record is None:
            raise FileNotFoundError(f"hook record for {operation_id!r} disappeared")
        return record


def _check_identity(record: HookRecord, kind: str, workspace: Path) -> None:
    if (record.kind, record.workspace) != (kind, str(workspace)):
        raise HookIdentityMismatch(
            f"operation {record.operation_id!r} is the {record.kind} hook of {record.workspace}, "
            f"not the {kind} hook of {workspace}"
        )


def _supervisor_alive(record: HookRecord) -> bool:
    return is_same_process(record.supervisor_pid, record.supervisor_started_at)


def _wait_for_exit(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read()
    except FileNotFoundError:
        return b""


def _outcome(record: HookRecord) -> HookOutcome:
    assert record.outcome is not None
    return HookOutcome(record.outcome, record.exit_code, record.message)
