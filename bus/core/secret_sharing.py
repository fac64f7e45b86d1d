"""The projects' secret values shared between the replicas of one store (SPEC 11): each keeps them
in its own data dir, tells the others each set or removal, and asks them for what it lacks
(handlers/secrets.py says when). On a core-only subject, answered onto the core's service inbox:
a value is in no stream and reaches no client or agent user (bus/access.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.replica_messages import ReplicaPresence, ReplicaSecret, ReplicaSecretsHeld
from bb_environments.domain.errors import DomainError
from bb_environments.handlers.secrets import Secrets, SharedSecret

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 2.0
"""Per replica, asked all at once: one that does not answer in this is counted as not having answered."""

_secret_decoder = msgspec.json.Decoder(ReplicaSecret)
_held_decoder = msgspec.json.Decoder(ReplicaSecretsHeld)


class SecretsAcrossReplicas:
    def __init__(self, nc: Client, replica_id: str, present: Callable[[], Awaitable[list[ReplicaPresence]]]) -> None:
        self._nc = nc
        self._replica_id = replica_id
        self._present = present

    async def tell(self, change: SharedSecret) -> None:
        await self._ask_others(_wire(change))

    async def held(self, project_path: str) -> tuple[list[SharedSecret], bool]:
        answers = await self._ask_others(ReplicaSecret("send", project_path))
        held = [
            _shared(secret)
            for answer in answers
            if answer is not None
            for secret in _held_or_empty(answer).secrets
            if secret.project_path == project_path and secret.kind == "set"
        ]
        return held, all(answer is not None for answer in answers)

    async def answer(self, secrets: Secrets) -> Subscription:
        async def told(message: Msg) -> None:
            try:
                asked = _secret_decoder.decode(message.data)
                if asked.kind == "send":
                    held = [_wire(secret) for secret in await secrets.shareable(asked.project_path)]
                    reply = msgspec.json.encode(ReplicaSecretsHeld(held))
                else:
                    await secrets.received(_shared(asked))
                    reply = b"{}"
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError, DomainError) as unreadable:
                log.warning("ignored a message on %s: %s", message.subject, unreadable)
                return
            if message.reply:
                with contextlib.suppress(NatsError):  # the asker counts this replica as not answering
                    await message.respond(reply)

        return await self._nc.subscribe(subjects.replica_secrets(self._replica_id), cb=told)

    async def _ask_others(self, asked: ReplicaSecret) -> list[bytes | None]:
        """Each other present replica's answer (None: it gave none in time)."""
        try:
            others = [p.replica_id for p in await self._present() if p.replica_id != self._replica_id]
        except NatsError:
            return [None]  # who else runs is unknown: as if one did not answer
        payload = msgspec.json.encode(asked)
        return list(await asyncio.gather(*(self._ask(replica_id, payload) for replica_id in others)))

    async def _ask(self, replica_id: str, payload: bytes) -> bytes | None:
        try:
            reply = await self._nc.request(subjects.replica_secrets(replica_id), payload, timeout=ASK_TIMEOUT_S)
        except (NatsError, TimeoutError):
            return None
        return reply.data


def _held_or_empty(answer: bytes) -> ReplicaSecretsHeld:
    try:
        return _held_decoder.decode(answer)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ReplicaSecretsHeld([])


def _wire(secret: SharedSecret) -> ReplicaSecret:
    if secret.value is None:
        return ReplicaSecret("removed", secret.project_path, secret.name)
    assert secret.set_at is not None  # a set is told once the log recorded it
    return ReplicaSecret("set", secret.project_path, secret.name, secret.value, secret.set_at.isoformat())


def _shared(secret: ReplicaSecret) -> SharedSecret:
    if secret.kind == "removed":
        return SharedSecret(secret.project_path, secret.name, None)
    return SharedSecret(secret.project_path, secret.name, secret.value, datetime.fromisoformat(secret.set_at))
