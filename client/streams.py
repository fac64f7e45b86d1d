"""Reading a stream the way a client role may, and riding a restart of the service out.

A client reads with pull consumers of its own, created by name and filter (the one way its
permissions allow, see bus/access.py), acknowledging nothing and kept in memory: the server drops
one soon after its client stopped asking. A restart of `bb serve` stops its nats-server and with
it such a consumer, so a reader notices that its consumer is gone, waits for the connection to be
back and goes on from the message after the last it gave, never repeating or skipping one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import api

IDLE_CHECK_S = 5.0
"""How long a reader waits for a message before it checks that its consumer is still there."""
RESUME_WAIT_S = 0.5
"""Between two attempts to make a consumer again while the bus is away."""
_FORGET_S = 30.0
_BATCH = 256


async def follow(
    nc: Nats,
    stream: str,
    subject: str,
    deliver: api.DeliverPolicy,
    start_sequence: int | None = None,
    until_caught_up: bool = False,
) -> AsyncGenerator[Msg, None]:
    """`subject`'s messages in `stream`, from where `deliver` says (ALL, LAST_PER_SUBJECT or NEW)
    or from `start_sequence`, as they are stored; with `until_caught_up`, only those stored when
    it started (then it ends)."""
    resume_at = start_sequence
    if deliver == api.DeliverPolicy.NEW:  # "new" once the bus is back would skip what came meanwhile
        resume_at = (await nc.jetstream().stream_info(stream)).state.last_seq + 1
    while True:
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=_FORGET_S,
            mem_storage=True,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if resume_at is not None else deliver,
            opt_start_seq=resume_at,
        )
        try:
            reader = await nc.jetstream().pull_subscribe(subject, stream=stream, config=config)
        except (TimeoutError, NatsError):  # the bus is away: a restart of the service, say
            await asyncio.sleep(RESUME_WAIT_S)
            continue
        try:
            if until_caught_up and (await reader.consumer_info()).num_pending == 0:
                return
            while True:
                try:
                    batch = await reader.fetch(_BATCH, timeout=IDLE_CHECK_S)
                except TimeoutError:  # nats-py's own is one too
                    await reader.consumer_info()  # raises once the server no longer has it
                    continue
                for message in batch:
                    resume_at = message.metadata.sequence.stream + 1
                    yield message
                    if until_caught_up and message.metadata.num_pending == 0:
                        return
        except (TimeoutError, NatsError):
            await asyncio.sleep(RESUME_WAIT_S)
        finally:
            try:
                await reader.unsubscribe()
            except NatsError:  # with the connection gone there is nothing to unsubscribe
                pass
