"""The core's answers to the host agents' questions about the log (bb.hosts.<hostId>.ledger):
what it recorded for a hook operation, told only to the agent of the host it belongs to. Only that
host's NATS user may publish on its subject, so the subject says who asks.

The secrets of a hook the agent is about to run (bb.hosts.<hostId>.secrets, SPEC 11) are answered
the same way, and only onto that agent's own inbox, which no other user may read: a request whose
reply subject is anywhere else gets no answer. Nor does one this replica cannot answer with every
value the log names (handlers/secrets.py SecretsLacking): the agent asks again, and the queue
group may hand its question to another replica."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bb_environments.bus.access import host_agent_inbox_prefix
from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import HookRef, HookSecretsAnswer, RecordedHookAnswer
from bb_environments.domain.ids import quoted
from bb_environments.handlers.secrets import SecretsLacking
from bb_environments.hooks.ledger import HookLedger

log = logging.getLogger(__name__)


async def answer_ledger_questions(nc: Client, ledger: HookLedger, health: BusHealth) -> list[Subscription]:
    async def recorded(host_id: str, asked: HookRef) -> bytes:
        recorded = await ledger.recorded_hook(asked.operation_id)
        if recorded is not None and recorded.host_id != host_id:
            recorded = None  # another host's operation: as if there were none
        return msgspec.json.encode(RecordedHookAnswer(recorded))

    async def secrets(host_id: str, asked: HookRef) -> bytes:
        return msgspec.json.encode(HookSecretsAnswer(await ledger.hook_secrets(asked.operation_id, host_id)))

    return [
        await nc.subscribe(subjects.HOST_LEDGER_REQUESTS, queue="ledger", cb=_answering(recorded, health)),
        await nc.subscribe(
            subjects.HOST_SECRETS_REQUESTS, queue="ledger", cb=_answering(secrets, health, private_reply=True)
        ),
    ]


def _answering(
    answer: Callable[[str, HookRef], Awaitable[bytes]], health: BusHealth, *, private_reply: bool = False
) -> Callable[[Msg], Awaitable[None]]:
    async def respond(message: Msg) -> None:
        if not message.reply:
            return
        host_id = subjects.host_of(message.subject)
        if private_reply and not message.reply.startswith(host_agent_inbox_prefix(host_id) + "."):
            log.warning("ignored a question for secrets from host %s not asked from its own inbox", quoted(host_id))
            return
        try:
            asked = msgspec.json.decode(message.data, type=HookRef)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            log.warning("ignored a malformed ledger question from host %s", quoted(host_id))
            return
        try:
            await message.respond(await answer(host_id, asked))
        except SecretsLacking as lacking:
            log.warning("left host %s's question for secrets unanswered: %s", quoted(host_id), lacking)
        except BUS_UNAVAILABLE as error:
            health.noticed(f"answering host {host_id!r} about operation {asked.operation_id!r}", error)

    return respond
