"""Riding out an outage of the bus: one log line when NATS goes away, one when it is back.

nats-py reconnects forever by itself and tells its error callback about every failed attempt
(twice a second per connection); each loop of the service (consumers, relay, transcript, hook
requests) finds out on its own too, as timeouts, 503s, "no responders" or a closed connection.
They all report here instead of logging: the first report of an outage logs it, and the last
one to recover logs that it is over. A loop waits between attempts (0.1 s, doubling up to 5 s)
and then simply goes on; nothing the service runs ends because the bus was away for a while.
A start waits the same way (`once_answered`) for a cluster still forming, and says once what for.
Errors that are not the bus being away (a permissions violation, a refused request) are logged
as they come.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypedDict, TypeVar

from nats.aio.client import Client
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    ConnectionReconnectingError,
    NoRespondersError,
    NoServersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from bb_environments.providers.host.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_PAUSE_S = 0.1
LONGEST_PAUSE_S = 5.0
SETTLE_S = 2.0

BUS_UNAVAILABLE: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,  # nats-py's own TimeoutError is one
    ConnectionError,
    StaleConnectionError,
    NoServersError,
    NoRespondersError,
    ConnectionClosedError,
    ConnectionDrainingError,
    ConnectionReconnectingError,
    OutboundBufferLimitError,
    ServiceUnavailableError,
    NoStreamResponseError,
)


NO_SUITABLE_PEERS = 10005
"""JetStream's refusal to place a stream: its description says why (a peer offline or not current
yet, insufficient storage...)."""
STORAGE_EXCEEDED = 10047
INSUFFICIENT_RESOURCES = 10023
"""A single server's refusals of a stream it has no room for."""
STREAM_NOT_FOUND = 10059


def unavailable(error: BaseException) -> bool:
    """The bus (a server, a stream's leader, a responder, a peer of the cluster) is away: worth
    waiting for, not a failure."""
    return isinstance(error, BUS_UNAVAILABLE) or (_refused_placement(error) and not short_of_room(error))


def short_of_room(error: BaseException) -> bool:
    """The servers have no room for a stream: no wait makes it (JetStream's code on a single
    server, its placement's reason in a cluster)."""
    return jetstream_code(error) in (STORAGE_EXCEEDED, INSUFFICIENT_RESOURCES) or (
        _refused_placement(error)
        and "insufficient storage" in _description(error)
        and "offline" not in _description(error)  # a peer that is back may have the room
    )


def _not_caught_up(error: BaseException) -> bool:
    """At a start, a stream that was made a moment ago (by this replica or another) is unknown to
    a server whose share of the cluster's metadata is not current yet."""
    return jetstream_code(error) == STREAM_NOT_FOUND


def _refused_placement(error: BaseException) -> bool:
    return jetstream_code(error) == NO_SUITABLE_PEERS


# nats-py's KeyValue errors are APIErrors that set none of its fields (KeyNotFoundError: a lease's
# key gone in a leader change, or expired between a refused create and nats-py's look at it), so
# these two read them as absent rather than raise AttributeError on them.


def jetstream_code(error: BaseException) -> int | None:
    """JetStream's own code for a refusal (`err_code`), if the error carries one."""
    return getattr(error, "err_code", None) if isinstance(error, APIError) else None


def _description(error: BaseException) -> str:
    return (getattr(error, "description", None) or "") if isinstance(error, APIError) else ""


def describe(error: BaseException) -> str:
    # An APIError's str() lists every field, mostly None; nats-py's KeyValue errors have a str() of
    # their own.
    if isinstance(error, APIError) and hasattr(error, "description"):
        text = _description(error)
    else:
        text = str(error).removeprefix("nats: ").removeprefix(f"{type(error).__name__}: ")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class ConnectionCallbacks(TypedDict):
    error_cb: Callable[[Exception], Awaitable[None]]
    disconnected_cb: Callable[[], Awaitable[None]]
    reconnected_cb: Callable[[], Awaitable[None]]


class BusHealth:
    def __init__(self, starting: bool = False) -> None:
        """`starting`: the service waits for the bus before it serves, until `started()`: what it
        waits for meanwhile (a cluster still forming, its servers still starting) is told once."""
        self._troubles: dict[object, str] = {}  # who is waiting for the bus, and why
        self._since: float | None = None  # when the outage being told began
        self._cleared = 0.0
        self._telling_back: asyncio.TimerHandle | None = None
        self._starting = starting

    @property
    def available(self) -> bool:
        return not self._troubles

    def lost(self, who: object, why: str) -> None:
        if self._telling_back is not None:  # the same outage, flapping: told already
            self._telling_back.cancel()
            self._telling_back = None
        elif self._since is None:
            self._since = time.monotonic()
            if self._starting:
                log.warning(
                    "waiting for the NATS cluster before serving (%s); a cluster still forming is "
                    "waited for as long as it takes",
                    why,
                )
            else:
                log.warning("lost the NATS bus (%s); waiting for it to come back", why)
        self._troubles.setdefault(who, why)

    def back(self, who: object) -> None:
        if self._troubles.pop(who, None) is None or self._troubles or self._since is None:
            return
        # Told a moment later: a connection that came back to another node of a cluster whose
        # stream is still without its leader is the same outage, not a second one. A start's
        # waits are one, told when it is over.
        self._cleared = time.monotonic()
        if self._starting:
            return
        self._telling_back = asyncio.get_running_loop().call_later(SETTLE_S, self._tell_back)

    def _tell_back(self) -> None:
        assert self._since is not None  # `back` schedules this only during an outage, and `lost` cancels it
        log.warning("the NATS bus is back after %.1f s", self._cleared - self._since)
        self._since, self._telling_back = None, None

    def started(self) -> None:
        """The service serves: an outage from now on is one of its own."""
        self._starting = False
        if self._since is not None and not self._troubles:
            log.warning("the NATS cluster answered after %.1f s", self._cleared - self._since)
            self._since = None

    def noticed(self, what: str, error: BaseException) -> None:
        """A failure that nobody retries (a reply, a notice that is asked for again anyway):
        expected while the bus is away, worth a line otherwise."""
        if self.available or not unavailable(error):
            log.warning("%s: %s", what, describe(error))

    def watch(self, nc: Client, name: str) -> ConnectionCallbacks:
        """nats-py callbacks for `nc`, to pass to its `connect`."""

        refused = [0]

        async def error(error: Exception) -> None:
            # The end of the connection (EOF, a stale one), then each failed attempt to reconnect;
            # anything else, a refusal of our credentials included, is worth its line.
            if isinstance(error, StaleConnectionError) or (nc.is_reconnecting and isinstance(error, OSError)):
                self.lost(nc, f"connection {name}: {describe(error)}")
            elif isinstance(error, OSError) and not nc.is_connected:
                # The first connection goes on to the next server: a wait once none answered.
                refused[0] += 1
                if refused[0] >= len(nc.servers):
                    self.lost(nc, f"connection {name}: no server answers, the last {describe(error)}")
            else:
                self.noticed(f"nats ({name})", error)

        async def disconnected() -> None:
            if not nc.is_closed:  # closing calls this too
                self.lost(nc, f"connection {name} dropped")

        async def reconnected() -> None:
            self.back(nc)

        return {"error_cb": error, "disconnected_cb": disconnected, "reconnected_cb": reconnected}

    def retry(self, what: str) -> Retry:
        return Retry(self, what)

    async def once_answered(self, what: str, ask: Callable[[], Awaitable[T]]) -> T:
        """`ask()`'s answer, asked again for as long as the bus is away: at a start, a cluster
        still forming (no meta leader, a stream or bucket whose leader is not elected yet, a peer
        offline or catching up) is waited for, with one line saying what for. Anything else,
        a cluster without room for a stream included, is `ask`'s to raise."""
        bus = self.retry(what)
        while True:
            try:
                answer = await ask()
            except Exception as error:
                if not (unavailable(error) or _not_caught_up(error)):
                    raise
                await bus.pause(error)
                continue
            bus.succeeded()
            return answer


class Retry:
    """One loop's way through outages: report each failed attempt, pause, try again."""

    def __init__(self, health: BusHealth, what: str) -> None:
        self._health = health
        self._what = what
        self._backoff = Backoff(None, what, first_s=FIRST_PAUSE_S, max_s=LONGEST_PAUSE_S)

    def failed(self, error: BaseException) -> float:
        """The seconds to wait before the next attempt."""
        if unavailable(error):
            self._health.lost(self, f"{self._what}: {describe(error)}")
        else:
            log.warning("%s failed (%s); trying again", self._what, describe(error))
        return self._backoff.failed(error)

    async def pause(self, error: BaseException) -> None:
        await asyncio.sleep(self.failed(error))

    def succeeded(self) -> None:
        self._backoff.succeeded()
        self._health.back(self)
