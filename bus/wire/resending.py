"""Sending again what was not answered: a client's side of replicas and a cluster's failover.

A request (or a publish to a stream) is sent in attempts, each given ATTEMPT_S to be answered,
and sent again until one is answered or the caller's own timeout passes. Two things make an
attempt go unanswered:

- Nobody took it (NOBODY_TOOK_IT): when a node of a NATS cluster dies, the replicas connected to it
  reconnect to another node within about a second, and a stream whose leader was there has none
  until it elects another. Sent again after a short pause; after NOBODY_THERE_PATIENCE_S of that
  the sender is told, since nobody is there.
- Somebody took it and never answered: the replica that took it was killed, or stopped (SIGSTOP,
  a paused VM), which NATS goes on handing its turn at the queue group until its pings find it
  gone. Sent again, it reaches a replica that answers.

Whoever receives a message twice must take it once: the API's changes are idempotent (a spawn
by its thread id, an archive of an archived thread changes nothing), a thread event carries a
message id the stream drops a repeat of.
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
ATTEMPT_S = 2.0
"""How long one attempt waits for its answer before the message is sent again. A replica answers
a request in milliseconds; one killed or stopped with it never does. An answer to an earlier
attempt that comes late still counts where the sender can hear it (an API request's one inbox)."""
_FIRST_PAUSE_S = 0.1
_LONGEST_PAUSE_S = 1.0


async def sent_until_answered(
    attempt: Callable[[float], Awaitable[T]],
    *,
    timeout: float,
    attempt_s: float = ATTEMPT_S,
    until: Callable[[], bool] = lambda: True,
    patience_s: float = NOBODY_THERE_PATIENCE_S,
) -> T:
    """The answer of `attempt(wait)`, which sends the message once more and waits at most `wait`
    seconds (`attempt_s`, or what is left) for its answer (raising TimeoutError without one). Sent again while unanswered, until
    `timeout` seconds have passed (then the last TimeoutError), and while nobody takes it
    (NOBODY_TOOK_IT) for at most `patience_s` seconds and while `until()` holds (a reason to go on
    waiting: the service's process still lives, say; then the last such error)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    nobody_since: float | None = None
    pause = _FIRST_PAUSE_S
    while True:
        try:
            return await attempt(max(0.0, min(attempt_s, deadline - loop.time())))
        except NOBODY_TOOK_IT:
            now = loop.time()
            nobody_since = now if nobody_since is None else nobody_since
            if now + pause > min(deadline, nobody_since + patience_s) or not until():
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)
        except TimeoutError:  # nats-py's own is one too
            if loop.time() >= deadline:
                raise
            nobody_since, pause = None, _FIRST_PAUSE_S  # somebody took it: whoever is there now may answer
