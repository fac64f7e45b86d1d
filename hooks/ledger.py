"""What the log lets a host do with a hook operation: run or join it, stop it, forget it.

Whoever asks a host for a hook is not trusted with what the request says: a host acts only on
what the log recorded for the operation id (its `HookLedger`). It starts or joins a hook only while
the log awaits that operation's outcome, only for an environment of its own host, and only in the
workspace the log recorded; it stops one only when the log no longer waits for it (a cancelled
environment's setup, say). Anything else is refused (`HookRefused`).

Retention: the records and output log of an operation whose environment is removed are deleted
once the hook settled (finished, or was cancelled before it started) more than a maximum age ago
(BB_REMOVED_RETENTION_S). Nothing waits for such an operation any more, and a request for it is
refused, so no run, join or replay can need them; a record still running is never deleted.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol

from bb_environments.domain.hook_operations import RecordedHook
from bb_environments.domain.ids import quoted
from bb_environments.hooks.runner import HookRunner
from bb_environments.providers.contract import HostUnavailable


class HookLedger(Protocol):
    """What the log recorded for a hook operation id. In `bb serve` it is the event store itself;
    a `bb agent` asks the core for the same answer (bus/agent/bus_ledger.py)."""

    async def recorded_hook(self, operation_id: str) -> RecordedHook | None: ...

    async def hook_secrets(self, operation_id: str, host_id: str) -> dict[str, str]:
        """The secrets of its environment's project that the hook gets as variables (SPEC 11), if
        the log awaits the operation on `host_id`; else none."""
        ...


class HookRefused(HostUnavailable):
    """A request the log does not back: nothing runs or stops. To the core a host that refused
    waits like one that is away: its ledger may not have caught up with the log yet."""

    def __init__(self, operation_id: str | None, reason: str) -> None:
        super().__init__(reason)
        self.operation_id = operation_id
        self.reason = reason


class HookGuard:
    """The ledger's answers for one host's requests."""

    def __init__(self, ledger: HookLedger, host_id: str) -> None:
        self._ledger = ledger
        self._host_id = host_id

    async def recorded(self, operation_id: str) -> RecordedHook:
        """The log's record of an operation of this host."""
        recorded = await self._ledger.recorded_hook(operation_id)
        if recorded is None:
            raise HookRefused(operation_id, "the log recorded no such hook operation")
        return self._of_this_host(recorded)

    def _of_this_host(self, recorded: RecordedHook) -> RecordedHook:
        if recorded.host_id != self._host_id:
            raise HookRefused(recorded.operation_id, f"it belongs to host {recorded.host_id!r}, not {self._host_id!r}")
        return recorded

    async def to_run(
        self, operation_id: str, kind: str, environment_id: str, workspace: str, known: RecordedHook | None = None
    ) -> RecordedHook:
        """The operation, if the log awaits its outcome from exactly this hook.

        `known`: the log's answer for this very operation as the store's writer gave it to this
        process a moment ago (with the environment a command just saved, see current_hook),
        checked here as the ledger's would be, without asking the ledger again. Only the service's
        own core has one; a request from the bus never does. Why it is still the log's answer for
        all this checks when the hook starts: see current_hook.
        """
        if known is None:
            recorded = await self.recorded(operation_id)
        else:
            assert known.operation_id == operation_id, "the caller passed another operation's answer"
            recorded = self._of_this_host(known)
        if not recorded.awaited:
            raise HookRefused(operation_id, "the log awaits no outcome of it: it finished, or its environment moved on")
        if (kind, environment_id, workspace) != (recorded.kind, recorded.environment_id, recorded.workspace):
            raise HookRefused(
                operation_id,
                (
                    f"the log recorded the {recorded.kind} hook of environment {recorded.environment_id} in "
                    f"{recorded.workspace!r}, not the {quoted(kind)} hook of {quoted(environment_id)} in {quoted(workspace)}"
                ),
            )
        return recorded

    async def to_stop(self, operation_id: str) -> RecordedHook:
        """The operation, if stopping it loses nothing the log waits for."""
        recorded = await self.recorded(operation_id)
        if not recorded.stoppable:
            raise HookRefused(operation_id, "its environment still waits for its outcome")
        return recorded

    async def forget_removed(self, runner: HookRunner, max_age_s: float) -> list[str]:
        """Delete what `runner` keeps of this host's operations the retention rule (above) lets go.

        Safe to stop at any point: see HookRecords.delete. Returns the operations forgotten.
        """
        cutoff = datetime.now(UTC) - timedelta(seconds=max_age_s)
        await asyncio.to_thread(runner.delete_abandoned_writes, cutoff)
        forgettable = []
        for operation_id in await asyncio.to_thread(runner.settled_before, cutoff):
            recorded = await self._ledger.recorded_hook(operation_id)
            # An operation the log does not know (another store's, say) is not ours to judge.
            if (
                recorded is not None
                and recorded.host_id == self._host_id
                and recorded.environment_removed
                and not recorded.awaited
            ):
                forgettable.append(operation_id)
        return await runner.forget(forgettable)
