"""The host agent's ledger when the core's log is elsewhere: it asks the core, over the bus, what
the log recorded for one of this host's hook operations (answered by bus/core/ledger_answers.py)."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import HookRef, HookSecretsAnswer, RecordedHookAnswer
from bb_environments.domain.hook_operations import RecordedHook

LEDGER_TIMEOUT_S = 10.0


class BusLedger:
    def __init__(self, nc: Client, host_id: str) -> None:
        self._nc = nc
        self._subject = subjects.host_ledger(host_id)
        self._secrets_subject = subjects.host_secrets(host_id)

    async def recorded_hook(self, operation_id: str) -> RecordedHook | None:
        """Raises the bus's own errors while no core answers: nothing is decided without the log."""
        reply = await self._nc.request(
            self._subject, msgspec.json.encode(HookRef(operation_id)), timeout=LEDGER_TIMEOUT_S
        )
        return msgspec.json.decode(reply.data, type=RecordedHookAnswer).recorded

    async def hook_secrets(self, operation_id: str, host_id: str) -> dict[str, str]:
        """Asked on a subject only this agent may publish on, answered on its own inbox: the values
        are in no stream and reach no other user (docs/security.md)."""
        reply = await self._nc.request(
            self._secrets_subject, msgspec.json.encode(HookRef(operation_id)), timeout=LEDGER_TIMEOUT_S
        )
        return msgspec.json.decode(reply.data, type=HookSecretsAnswer).secrets
