"""The core's answers to the host agents' questions about the log (bb.hosts.<hostId>.ledger):
what it recorded for a hook operation, told only to the agent of the host it belongs to. Only that
host's NATS user may publish on its subject, so the subject says who asks."""

from __future__ import annotations

import logging

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import HookRef, RecordedHookAnswer
from bb_environments.domain.ids import quoted
from bb_environments.hooks.ledger import HookLedger

log = logging.getLogger(__name__)


async def answer_ledger_questions(nc: Client, ledger: HookLedger, health: BusHealth) -> Subscription:
    async def answer(message: Msg) -> None:
        if not message.reply:
            return
        host_id = subjects.host_of(message.subject)
        try:
            asked = msgspec.json.decode(message.data, type=HookRef)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            log.warning("ignored a malformed ledger question from host %s", quoted(host_id))
            return
        recorded = await ledger.recorded_hook(asked.operation_id)
        if recorded is not None and recorded.host_id != host_id:
            recorded = None  # another host's operation: as if there were none
        try:
            await message.respond(msgspec.json.encode(RecordedHookAnswer(recorded)))
        except BUS_UNAVAILABLE as error:
            health.noticed(f"answering host {host_id!r} about operation {asked.operation_id!r}", error)

    return await nc.subscribe(subjects.HOST_LEDGER_REQUESTS, queue="ledger", cb=answer)
