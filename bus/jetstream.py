"""The connection, and the loops that take messages from durable consumers (`consume`, `follow`);
the streams, buckets and consumers themselves are made in bus/streams.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypedDict, Unpack

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth, Retry, unavailable
from bb_environments.bus.streams import ensure_consumer
from bb_environments.bus.wire.server_file import nats_servers
from bb_environments.providers.host.backoff import Backoff

log = logging.getLogger(__name__)


class ConnectOptions(TypedDict, total=False):
    """The nats-py connect options that carry who we are (and how the server proves who it is)."""

    tls: ssl.SSLContext
    user_credentials: str
    nkeys_seed: str
    token: str
    user: str
    password: str


async def connect(
    url: str, name: str, health: BusHealth, inbox_prefix: str, **options: Unpack[ConnectOptions]
) -> Client:
    """Reconnect forever: the embedded server may be restarted under a running service, and its
    absence meanwhile is `health`'s to report, once. Every inbox of the connection (its requests'
    replies, pull consumer deliveries, acks) is under `inbox_prefix`, which no client may read."""
    nc = Client()
    # nats-py annotates reconnect_time_wait as int, but only sleeps for it: half a second works.
    await nc.connect(
        nats_servers(url),
        name=name,
        inbox_prefix=inbox_prefix,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,  # type: ignore[arg-type]
        **health.watch(nc, name),
        **options,
    )
    health.back(nc)  # no longer waiting for a server, if it was
    return nc


Handler = Callable[[list[Msg]], Awaitable[None]]

FOLLOW_HEARTBEAT_S = 1.0
"""How often the server tells a follower's ordered consumer it is alive while nothing new comes.
nats-py makes the consumer again (from where it was) after two beats missed, and again every two
after that until it is made: a consumer lost with its node (or its stream's leader) is found gone
in 2 s and made again within 2 s of the stream having a leader. nats-py's default of 5 s made that
10 s, and 10 more for each try that found no leader yet, while the read models, the placement
outcomes and the driver behind them stood still."""

# A pull request asks for up to this many messages and stays open on the server until it has them
# or this long has passed; the fetches in between take whatever has arrived.
PULL_EXPIRES_S = 5.0
# After this much longer without an answer, a request counts as lost; one sent before a reconnect
# is taken as lost at once (the server it reached may have gone).
_LOST_AFTER_S = 1.0


class JetStream(JetStreamContext):
    """nats-py's JetStream context, made on `nc` as `nc.jetstream()` makes it, with the connection
    and the JetStream API prefix in view: a PullFeed sends its pull requests on them."""

    def __init__(self, nc: Client, api_prefix: str = api.DEFAULT_PREFIX) -> None:
        super().__init__(nc, prefix=api_prefix)
        self.nc = nc
        self.api_prefix = api_prefix


class Fetcher(Protocol):
    async def fetch(self, batch: int, timeout: float) -> list[Msg]: ...


class PullFeed:
    """A durable pull consumer's messages, read off one long-lived pull request at a time.

    nats-py's `fetch` sends a request (two, for a batch) per call and starts a task, a timer and a
    uuid per message it waits for; at hundreds of messages a second that was a large share of the
    service's time. Here one request stays open while the handler works: the server sends the
    consumer's next messages as they come (an in-order consumer's next one as soon as the last is
    acknowledged), the subscription's callback only collects them, and a fetch hands over all
    that arrived. What the server does not deliver stays its to deliver again, as before.
    """

    def __init__(self, nc: Client, api_prefix: str, stream: str, durable: str) -> None:
        self._nc = nc
        self._next = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._arrived: list[Msg] = []
        self._wakeup = asyncio.Event()
        self._failure: Exception | None = None
        self._open = 0  # messages the open request may still bring
        self._open_until = 0.0
        self._connection = -1  # the connection (count of reconnects) the open request was sent on

    @classmethod
    async def bind(cls, js: JetStream, durable: str, stream: str) -> PullFeed:
        feed = cls(js.nc, js.api_prefix, stream, durable)
        await feed._nc.subscribe(feed._inbox, cb=feed._receive)
        return feed

    async def _receive(self, message: Msg) -> None:
        headers = message.headers or {}
        # A stream's message always carries its ack subject; the server's status messages never do.
        # Headers alone cannot tell them apart: a publisher may send its own empty `Status` message.
        status = None if message.reply else headers.get(api.Header.STATUS)
        if status is None:
            self._arrived.append(message)
            self._open -= 1
        elif status in (api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT):
            self._open = 0  # the request ended with nothing (more) to bring
        elif status == api.StatusCode.SERVICE_UNAVAILABLE:  # no consumer (or no stream leader) to ask
            self._open, self._failure = 0, NoRespondersError()
        elif status == api.StatusCode.CONFLICT:
            # the consumer deleted, its leader changed...: asked again after a pause
            self._open, self._failure = (
                0,
                APIError(code=int(status), description=headers.get(api.Header.DESCRIPTION, "")),
            )
        else:  # a heartbeat, or something this feed never asked for
            return
        self._wakeup.set()

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """What arrived (up to `batch`), as soon as there is one; NatsTimeout after `timeout` without."""
        deadline = time.monotonic() + timeout
        while not self._arrived:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            now = time.monotonic()
            if now >= deadline:
                raise NatsTimeout
            self._wakeup.clear()  # before asking: what arrives while the request is sent must wake us
            if self._open <= 0 or now > self._open_until or self._nc.stats["reconnects"] != self._connection:
                await self._request(batch)
            try:
                await asyncio.wait_for(self._wakeup.wait(), min(deadline, self._open_until) - now)
            except TimeoutError:
                pass
        taken, self._arrived = self._arrived[:batch], self._arrived[batch:]
        return taken

    async def _request(self, batch: int) -> None:
        request = {"batch": batch, "expires": int(PULL_EXPIRES_S * 1e9)}
        self._open, self._open_until = batch, time.monotonic() + PULL_EXPIRES_S + _LOST_AFTER_S
        self._connection = self._nc.stats["reconnects"]
        await self._nc.publish(self._next, json.dumps(request).encode(), reply=self._inbox)


Binder = Callable[[JetStream, str, str], Awaitable[Fetcher]]


async def consume(
    js: JetStream,
    stream: str,
    durable: str,
    filter_subject: str,
    handle: Handler,
    health: BusHealth,
    batch: int = 200,
    in_order: bool = False,
    *,
    bind: Binder = PullFeed.bind,
) -> None:
    """Feed batches to `handle`, then ack them; a batch whose handler raised is redelivered.

    A handler that keeps failing (its database on a full disk, say) is given the batch again after
    a growing delay, and the log one line when that starts and one when it ends. While the bus is
    away (its server, the stream's leader) the consumer waits for it the same way, and `health`
    says so once for every loop.
    """
    bus = health.retry(f"consumer {durable}")

    async def consumer_made() -> None:
        while True:
            try:
                return await ensure_consumer(js, stream, durable, filter_subject, in_order)
            except BUS_UNAVAILABLE as error:
                await bus.pause(error)

    await consumer_made()
    subscription = await bind(js, durable, stream)
    backoff = Backoff(log, f"consumer {durable} handling a batch")
    while True:
        try:
            messages = await subscription.fetch(batch, timeout=1)
        except (TimeoutError, NatsTimeout):
            # nats-py turns a cancellation inside fetch into a timeout; do not swallow it.
            if _this_task().cancelling():
                raise asyncio.CancelledError from None
            bus.succeeded()  # nothing new; while the connection is down, its own report stands
            continue
        except NatsError as error:  # a 503 while a stream has no leader, a closed connection...
            await bus.pause(error)
            # Made again if it was deleted under us (by an operator, or lost with a node's state),
            # rather than asked for in vain for ever; otherwise a look that changes nothing.
            await consumer_made()
            continue
        try:
            await handle(messages)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # A handler that could not reach the bus waits for it like the fetch does; any other
            # failure is the handler's own.
            delay = bus.failed(error) if unavailable(error) else backoff.failed(error)
            await _settle(messages, lambda message: message.nak(delay=delay), bus)
            await asyncio.sleep(delay)
            continue
        backoff.succeeded()
        bus.succeeded()
        await _settle(messages, lambda message: message.ack(), bus)


def _this_task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None  # called only from the consumer's coroutine, which runs as a task
    return task


async def _settle(messages: list[Msg], settle: Callable[[Msg], Awaitable[None]], bus: Retry) -> None:
    """Ack or nak a batch. With no bus to say it on, the server redelivers the batch after its ack
    wait instead, and the handlers take it again as the no-op it then is."""
    try:
        for message in messages:
            await settle(message)
    except BUS_UNAVAILABLE as error:
        await bus.pause(error)


async def follow(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    after: Callable[[], Awaitable[int]],
    handle: Handler,
    health: BusHealth,
    name: str,
    batch: int = 200,
) -> None:
    """Feed `handle` every message of `stream` after the sequence `after()` gives, in order, as an
    ordered consumer of this replica's own (SPEC 7.2: each replica keeps its own read models).

    Nothing of it lives on the server but while it runs: the client makes it again, from where it
    was, after a gap, a reconnect or a node's loss, and a client that deletes it takes nothing
    from us. A batch whose handler raised is handled again (from a new consumer that starts at it),
    so `after()` must name what the handlers have finished with.
    """
    bus = health.retry(name)
    backoff = Backoff(log, f"{name} handling a batch")
    while True:
        try:
            start = await after() + 1
            subscription = await js.subscribe(
                filter_subject,
                stream=stream,
                ordered_consumer=True,
                idle_heartbeat=FOLLOW_HEARTBEAT_S,
                config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start),
            )
        except BUS_UNAVAILABLE as error:
            await bus.pause(error)
            continue
        try:
            await _follow_until_failed(subscription, handle, bus, backoff, batch)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


async def _follow_until_failed(
    subscription: JetStreamContext.PushSubscription, handle: Handler, bus: Retry, backoff: Backoff, batch: int
) -> None:
    while True:
        try:
            messages = [await subscription.next_msg(timeout=1)]
        except (TimeoutError, NatsTimeout):
            if _this_task().cancelling():
                raise asyncio.CancelledError from None
            bus.succeeded()
            continue
        while len(messages) < batch and subscription.pending_msgs:
            messages.append(await subscription.next_msg(timeout=None))
        try:
            await handle(messages)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            await asyncio.sleep(bus.failed(error) if unavailable(error) else backoff.failed(error))
            return
        backoff.succeeded()
        bus.succeeded()
