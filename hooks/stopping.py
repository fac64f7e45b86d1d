"""Stopping a hook's supervisor and closing the record of one that died (hooks/runner.py).

A cancel signals the supervisor (SIGTERM, then SIGKILL if it does not answer) and waits for it to
record the outcome; a supervisor that is gone leaves its record unfinished, which is closed here:
"cancelled" when the operation was tombstoned, else "interrupted", after killing the script's
process group if it lives on.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Literal

from bb_environments.hooks.records import HookRecord, HookRecords, now_iso
from bb_environments.hooks.supervisor_watch import supervisor_alive
from bb_environments.providers.host.processes import kill_recorded_group, signal_recorded_process

POLL_S = 0.02
CANCEL_WAIT_S = 10.0
SUPERVISOR_EXIT_WAIT_S = 2.0

CancelResult = Literal["never-started", "finished", "terminated"]


class SupervisorStopping:
    def __init__(self, records: HookRecords) -> None:
        self._records = records
        self._locks: dict[str, asyncio.Lock] = {}

    def forget(self, operation_id: str) -> None:
        """The operation's record is gone: so is its lock."""
        self._locks.pop(operation_id, None)

    async def stop(self, record: HookRecord | None) -> CancelResult:
        if record is None:
            return "never-started"
        if record.finished_at is not None:
            return "finished"
        operation_id = record.operation_id
        if signal_recorded_process(record.supervisor_pid, record.supervisor_started_at, signal.SIGTERM):
            record = await self._wait_until_finished(operation_id, CANCEL_WAIT_S)
            unresponsive = record.finished_at is None
            if unresponsive and signal_recorded_process(
                record.supervisor_pid, record.supervisor_started_at, signal.SIGKILL
            ):
                await self._wait_until_finished(operation_id, SUPERVISOR_EXIT_WAIT_S)
        record = await self.close_orphaned(operation_id)
        if record.outcome != "cancelled":
            return "finished"
        return "terminated" if record.script_pid is not None else "never-started"

    async def _wait_until_finished(self, operation_id: str, timeout_s: float) -> HookRecord:
        """The record once finished, its supervisor gone, or the time is up."""
        deadline = time.monotonic() + timeout_s
        record = await self._read_existing(operation_id)
        while record.finished_at is None and time.monotonic() < deadline:
            if not await asyncio.to_thread(supervisor_alive, record):
                break
            await asyncio.sleep(POLL_S)
            record = await self._read_existing(operation_id)
        return record

    async def close_orphaned(self, operation_id: str) -> HookRecord:
        """Finish a record whose supervisor is dead, killing the script's group if it lives on.

        Callers have seen the supervisor dead (or killed it); the lock keeps a concurrent cancel
        and run from closing the same record twice.
        """
        async with self._locks.setdefault(operation_id, asyncio.Lock()):
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
