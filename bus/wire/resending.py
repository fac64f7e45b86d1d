"""Sending again what nobody was there to take: a client's side of a cluster's failover.

When a node of a NATS cluster dies, the service's replicas connected to it reconnect to another
node within about a second; meanwhile a request finds no responder and a stream whose leader was
there has none yet. Nothing took the message, so sending it again does nothing twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import NoRespondersError
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

T = TypeVar("T")

NOBODY_TOOK_IT = (NoRespondersError, NoStreamResponseError, ServiceUnavailableError)
"""A request with no responder, a publish no stream leader stored (JetStream's 503)."""

NOBODY_THERE_PATIENCE_S = 5.0
"""How long a message nobody takes is sent again before the sender is told: a replica's reconnect,
or a stream's election of a new leader, with room to spare."""
_FIRST_PAUSE_S = 0.1
_LONGEST_PAUSE_S = 1.0


async def resent_while_nobody_takes(send: Callable[[], Awaitable[T]], *, until: Callable[[], bool] = lambda: True,
                                    patience_s: float = NOBODY_THERE_PATIENCE_S) -> T:
    """`send()`'s result, sent again while nobody takes it (NOBODY_TOOK_IT), for at most
    `patience_s` seconds and while `until()` holds (a reason to go on waiting: the service's process
    still lives, say); then the last such error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    pause = _FIRST_PAUSE_S
    while True:
        try:
            return await send()
        except NOBODY_TOOK_IT:
            if loop.time() + pause > deadline or not until():
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE_S)
