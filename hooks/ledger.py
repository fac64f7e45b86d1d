"""What the log lets a host do with a hook operation: run or join it, stop it.

Whoever asks a host for a hook is not trusted with what the request says: a host acts only on
what the log recorded for the operation id (its `HookLedger`). It starts or joins a hook only while
the log awaits that operation's outcome, only for an environment of its own host, and only in the
workspace the log recorded; it stops one only when the log no longer waits for it (a cancelled
environment's setup, say). Anything else is refused (`HookRefused`).
"""

from __future__ import annotations

from typing import Protocol

from bb_environments.domain.application import RecordedHook


class HookLedger(Protocol):
    """What the log recorded for a hook operation id. In `bb serve` it is the event store itself;
    an agent on another machine would ask the core for the same answer."""

    async def recorded_hook(self, operation_id: str) -> RecordedHook | None: ...


class HookRefused(Exception):
    """A request the log does not back: nothing runs or stops."""

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
        if recorded.host_id != self._host_id:
            raise HookRefused(operation_id, f"it belongs to host {recorded.host_id!r}, not {self._host_id!r}")
        return recorded

    async def to_run(self, operation_id: str, kind: str, environment_id: str, workspace: str) -> RecordedHook:
        """The operation, if the log awaits its outcome from exactly this hook."""
        recorded = await self.recorded(operation_id)
        if not recorded.awaited:
            raise HookRefused(operation_id, "the log awaits no outcome of it: it finished, or its environment moved on")
        if (kind, environment_id, workspace) != (recorded.kind, recorded.environment_id, recorded.workspace):
            raise HookRefused(operation_id, (
                f"the log recorded the {recorded.kind} hook of environment {recorded.environment_id} in "
                f"{recorded.workspace!r}, not the {kind!r} hook of {environment_id!r} in {workspace!r}"
            ))
        return recorded

    async def to_stop(self, operation_id: str) -> RecordedHook:
        """The operation, if stopping it loses nothing the log waits for."""
        recorded = await self.recorded(operation_id)
        if not recorded.stoppable:
            raise HookRefused(operation_id, "its environment still waits for its outcome")
        return recorded
