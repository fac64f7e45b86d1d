"""Riding out an outage of the bus: one log line when NATS goes away, one when it is back.

nats-py reconnects forever by itself and tells its error callback about every failed attempt
(twice a second per connection); each loop of the service (consumers, relay, transcript, hook
requests) finds out on its own too, as timeouts, 503s, "no responders" or a closed connection.
They all report here instead of logging: the first report of an outage logs it, and the last
one to recover logs that it is over. A loop waits between attempts (0.1 s, doubling up to 5 s)
and then simply goes on; nothing the service runs ends because the bus was away for a while.
Errors that are not the bus being away (a permissions violation, a refused request) are logged
as they come.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypedDict

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

FIRST_PAUSE_S = 0.1
LONGEST_PAUSE_S = 5.0
SETTLE_S = 2.0

BUS_UNAVAILABLE: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,  # nats-py's own TimeoutError is one
    ConnectionError, StaleConnectionError, NoServersError, NoRespondersError, ConnectionClosedError,
    ConnectionDrainingError, ConnectionReconnectingError, OutboundBufferLimitError, ServiceUnavailableError,
    NoStreamResponseError,
)


def unavailable(error: BaseException) -> bool:
    """The bus (a server, a stream's leader, a responder) is away: worth waiting for, not a failure."""
    return isinstance(error, BUS_UNAVAILABLE)


def describe(error: BaseException) -> str:
    # An APIError's str() lists every field, mostly None; nats-py's KeyValue errors (KeyNotFoundError,
    # a lease's key gone in a leader change) set none of them, and have a str() of their own.
    if isinstance(error, APIError) and hasattr(error, "description"):
        text = error.description or ""
    else:
        text = str(error).removeprefix("nats: ").removeprefix(f"{type(error).__name__}: ")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class ConnectionCallbacks(TypedDict):
    error_cb: Callable[[Exception], Awaitable[None]]
    disconnected_cb: Callable[[], Awaitable[None]]
    reconnected_cb: Callable[[], Awaitable[None]]


class BusHealth:
    def __init__(self) -> None:
        self._troubles: dict[object, str] = {}  # who is waiting for the bus, and why
        self._since: float | None = None  # when the outage being told began
        self._cleared = 0.0
        self._telling_back: asyncio.TimerHandle | None = None

    @property
    def available(self) -> bool:
        return not self._troubles

    def lost(self, who: object, why: str) -> None:
        if self._telling_back is not None:  # the same outage, flapping: told already
            self._telling_back.cancel()
            self._telling_back = None
        elif self._since is None:
            self._since = time.monotonic()
            log.warning("lost the NATS bus (%s); waiting for it to come back", why)
        self._troubles.setdefault(who, why)

    def back(self, who: object) -> None:
        if self._troubles.pop(who, None) is None or self._troubles or self._since is None:
            return
        # Told a moment later: a connection that came back to another node of a cluster whose
        # stream is still without its leader is the same outage, not a second one.
        self._cleared = time.monotonic()
        self._telling_back = asyncio.get_running_loop().call_later(SETTLE_S, self._tell_back)

    def _tell_back(self) -> None:
        assert self._since is not None  # `back` schedules this only during an outage, and `lost` cancels it
        log.warning("the NATS bus is back after %.1f s", self._cleared - self._since)
        self._since, self._telling_back = None, None

    def noticed(self, what: str, error: BaseException) -> None:
        """A failure that nobody retries (a reply, a notice that is asked for again anyway):
        expected while the bus is away, worth a line otherwise."""
        if self.available or not unavailable(error):
            log.warning("%s: %s", what, describe(error))

    def watch(self, nc: Client, name: str) -> ConnectionCallbacks:
        """nats-py callbacks for `nc`, to pass to its `connect`."""

        async def error(error: Exception) -> None:
            # The end of the connection (EOF, a stale one), then each failed attempt to reconnect;
            # anything else, a refusal of our credentials included, is worth its line.
            if isinstance(error, StaleConnectionError) or (nc.is_reconnecting and isinstance(error, OSError)):
                self.lost(nc, f"connection {name}: {describe(error)}")
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
