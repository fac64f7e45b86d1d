"""Connection, streams and durable consumers.

Consumers are created explicitly (`add_consumer`), because `pull_subscribe` silently keeps an
existing consumer's old settings.
"""

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
from nats.js.kv import KeyValue
from nats.js.errors import APIError, BadRequestError, BucketNotFoundError, NotFoundError

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.server_file import nats_servers
from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth, Retry, short_of_room, unavailable
from bb_environments.providers.host.backoff import Backoff

log = logging.getLogger(__name__)

TRANSCRIPT_LINES_PER_ENVIRONMENT = 2000
DUPLICATE_WINDOW_S = 120
"""How long the log, thread, transcript and placement streams remember the id of a message they
stored: a repeat within it (a batch of the log delivered again after a crash, a restarted agent
replaying a running hook's log) is dropped. The server keeps every id for that long, purged or
not, so its memory grows with the publish rate times this window: two minutes covers a restart;
a placement that may repeat later is looked up in its stream instead (bus/core/placements.py)."""
# Placement outcomes are kept a week, for subscribers that were away.
PLACEMENTS_MAX_AGE_S = 7 * 24 * 3600
# A host's job is queued once however often the core asks within the hour (a restart, a drive
# repeated); its report is kept a day, for a core that was away when it came.
HOST_JOBS_DUPLICATE_WINDOW_S = 3600
HOST_REPORTS_MAX_AGE_S = 24 * 3600
STREAM_NAME_IN_USE = 10058
"""JetStream's refusal of a stream that exists with other settings: it is updated instead."""
LEADER_ELECTION_S = 30.0
"""How long a start waits for a replicated stream's servers to elect its leader (Raft's election
timeout is 4 to 9 s, and a node of three may be restarting)."""
HOST_JOB_ACK_WAIT_S = 6
"""An agent killed mid-job has it delivered again after this (a running job says it is still at it)."""


class ConnectOptions(TypedDict, total=False):
    """The nats-py connect options that carry who we are (and how the server proves who it is)."""

    tls: ssl.SSLContext
    user_credentials: str
    nkeys_seed: str
    token: str
    user: str
    password: str


async def connect(url: str, name: str, health: BusHealth, inbox_prefix: str,
                  **options: Unpack[ConnectOptions]) -> Client:
    """Reconnect forever: the embedded server may be restarted under a running service, and its
    absence meanwhile is `health`'s to report, once. Every inbox of the connection (its requests'
    replies, pull consumer deliveries, acks) is under `inbox_prefix`, which no client may read."""
    nc = Client()
    # nats-py annotates reconnect_time_wait as int, but only sleeps for it: half a second works.
    await nc.connect(nats_servers(url), name=name, inbox_prefix=inbox_prefix, max_reconnect_attempts=-1,
                     reconnect_time_wait=0.5,  # type: ignore[arg-type]
                     **health.watch(nc, name), **options)
    health.back(nc)  # no longer waiting for a server, if it was
    return nc


def _streams(threads_max_age_s: float, threads_max_bytes: int) -> tuple[api.StreamConfig, ...]:
    return (
        # Thread events carry prompts: kept only within these limits. (The server refuses a
        # duplicate window longer than the age limit.)
        api.StreamConfig(
            name=subjects.THREADS_STREAM, subjects=[subjects.THREAD_EVENTS],
            storage=api.StorageType.FILE, duplicate_window=min(DUPLICATE_WINDOW_S, threads_max_age_s),
            max_age=threads_max_age_s, max_bytes=threads_max_bytes,
        ),
        # The same events, each under its thread's partition, for one in-order consumer per
        # partition. A mirror keeps the stream's sequence numbers and needs no server
        # configuration (an external NATS works as it is); it keeps what BB_THREADS keeps.
        api.StreamConfig(
            name=subjects.THREAD_PARTITIONS_STREAM, storage=api.StorageType.FILE,
            max_age=threads_max_age_s, max_bytes=threads_max_bytes,
            mirror=api.StreamSource(name=subjects.THREADS_STREAM, subject_transforms=[
                api.SubjectTransform(src=source, dest=destination)
                for source, destination in subjects.thread_partition_transforms()
            ]),
        ),
        api.StreamConfig(
            name=subjects.ENVIRONMENTS_STREAM, subjects=[subjects.LOG_EVENTS],
            storage=api.StorageType.FILE, duplicate_window=DUPLICATE_WINDOW_S,
            republish=api.RePublish(src=subjects.LOG_ENVIRONMENT_EVENTS, dest=subjects.ENVIRONMENT_EVENTS),
        ),
        api.StreamConfig(
            name=subjects.TRANSCRIPTS_STREAM, subjects=[subjects.TRANSCRIPT_EVENTS],
            storage=api.StorageType.FILE, max_msgs_per_subject=TRANSCRIPT_LINES_PER_ENVIRONMENT,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
        # The hosts' agents' lines, each gone once the core has checked it and kept it in
        # BB_TRANSCRIPTS (or dropped it); a flood waiting here is bounded like the transcripts.
        api.StreamConfig(
            name=subjects.TRANSCRIPT_INTAKE_STREAM, subjects=[subjects.HOST_TRANSCRIPTS],
            storage=api.StorageType.FILE, retention=api.RetentionPolicy.WORK_QUEUE,
            max_msgs_per_subject=TRANSCRIPT_LINES_PER_ENVIRONMENT, duplicate_window=DUPLICATE_WINDOW_S,
        ),
        api.StreamConfig(
            name=subjects.PLACEMENTS_STREAM, subjects=[subjects.PLACEMENT_EVENTS], storage=api.StorageType.FILE,
            max_age=PLACEMENTS_MAX_AGE_S, duplicate_window=DUPLICATE_WINDOW_S,
        ),
        # A job is gone once its host's agent acknowledged it (after storing its report).
        api.StreamConfig(
            name=subjects.HOST_JOBS_STREAM, subjects=[subjects.HOST_JOBS], storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.WORK_QUEUE, duplicate_window=HOST_JOBS_DUPLICATE_WINDOW_S,
        ),
        api.StreamConfig(
            name=subjects.HOST_REPORTS_STREAM, subjects=[subjects.HOST_REPORTS], storage=api.StorageType.FILE,
            max_msgs_per_subject=1, max_age=HOST_REPORTS_MAX_AGE_S, allow_direct=True,
        ),
    )


class NoRoomForStreams(RuntimeError):
    """The NATS servers cannot hold a stream the service needs; the message says which, the room it
    needs and what changes it, in one sentence."""


async def prepare_bus(js: JetStreamContext, health: BusHealth, threads_max_age_s: float, threads_max_bytes: int,
                      replicas: int, host_id: str) -> None:
    """The streams, the thread partitions' consumers and the hosts' bucket a core needs before it
    starts, each waited for while the cluster forms (BusHealth.once_answered)."""
    await health.once_answered("the streams", lambda: ensure_streams(js, threads_max_age_s, threads_max_bytes, replicas))
    await health.once_answered("the thread partitions' consumers", lambda: ensure_thread_partition_consumers(js))
    await health.once_answered("the retired consumers", lambda: retire_provisioner_consumer(js))
    await health.once_answered("the hosts' bucket", lambda: ensure_hosts(js, [host_id], replicas))


async def ensure_streams(js: JetStreamContext, threads_max_age_s: float, threads_max_bytes: int,
                         replicas: int = 1) -> None:
    """Create the streams, or give existing ones today's settings (a changed retention, say), each
    stored on `replicas` servers of the cluster. A replicated stream takes no publish before its
    servers elected a leader: each is waited for. Servers without room for one: NoRoomForStreams."""
    for config in _streams(threads_max_age_s, threads_max_bytes):
        config.num_replicas = replicas
        try:
            await js.add_stream(config)
        except APIError as refused:
            if short_of_room(refused):
                raise NoRoomForStreams(_no_room(config, threads_max_bytes, replicas)) from None
            if not isinstance(refused, BadRequestError) or refused.err_code != STREAM_NAME_IN_USE:
                raise
            await js.update_stream(config)
        if replicas > 1:
            await _until_led(js, config.name or "")


def _no_room(refused: api.StreamConfig, threads_max_bytes: int, replicas: int) -> str:
    servers = "the NATS server has" if replicas == 1 else "the NATS servers have"
    reserved = f"{_size(threads_max_bytes)} (BB_THREADS_MAX_BYTES)"
    threads, mirror = subjects.THREADS_STREAM, subjects.THREAD_PARTITIONS_STREAM
    if refused.name in (threads, mirror):
        other = f"its mirror {mirror}" if refused.name == threads else threads
        why = f"it reserves {reserved} on each server that holds it, as does {other}"
    else:
        why = f"{threads} and its mirror {mirror} reserve {reserved} each on every server that holds them"
    return (f"{servers} no room for stream {refused.name}: {why}, so give each server a max_file_store above "
            f"{_size(2 * threads_max_bytes)} or lower BB_THREADS_MAX_BYTES")


def _size(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB"):
        if size < 1024:
            return f"{size:g} {unit}"
        size /= 1024
    return f"{size:g} GiB"


async def _until_led(js: JetStreamContext, stream: str) -> None:
    deadline = time.monotonic() + LEADER_ELECTION_S
    while not ((info := await js.stream_info(stream)).cluster and info.cluster.leader):
        if time.monotonic() > deadline:
            raise NatsTimeout
        await asyncio.sleep(0.1)


async def ensure_hosts(js: JetStreamContext, host_ids: list[str], replicas: int = 1) -> None:
    """The heartbeat bucket, and each host's queue consumer (the agent's own host included)."""
    await ensure_bucket(js, api.KeyValueConfig(bucket=subjects.HOSTS_BUCKET, history=1, replicas=replicas))
    for host_id in host_ids:
        await ensure_host_jobs_consumer(js, host_id)


async def ensure_bucket(js: JetStreamContext, config: api.KeyValueConfig) -> KeyValue:
    """A key-value bucket, created with `config` unless it exists (it keeps its own settings then),
    once its servers elected a leader (a new one takes no write before)."""
    try:
        bucket = await js.key_value(config.bucket)
    except BucketNotFoundError:
        bucket = await js.create_key_value(config)
    if config.replicas > 1:
        await _until_led(js, f"KV_{config.bucket}")
    return bucket


async def ensure_host_jobs_consumer(js: JetStreamContext, host_id: str) -> None:
    """The one consumer of a host's jobs, which only that host's agent (its NATS user) may pull from."""
    config = api.ConsumerConfig(
        durable_name=subjects.host_jobs_consumer(host_id), filter_subject=subjects.host_jobs(host_id),
        ack_policy=api.AckPolicy.EXPLICIT, ack_wait=HOST_JOB_ACK_WAIT_S, max_ack_pending=1000,
    )
    await js.add_consumer(subjects.HOST_JOBS_STREAM, config)


async def ensure_consumer(js: JetStreamContext, stream: str, durable: str, filter_subject: str,
                          in_order: bool, start_sequence: int | None = None) -> None:
    """`in_order`: one unacknowledged message at a time, so a message that was delivered to a
    process that died is redelivered (after the short ack wait) before any later one.

    A new consumer starts at `start_sequence`, or at the stream's start; an existing one keeps
    where it started (the server refuses to change that) and takes today's other settings.
    """
    try:
        started = (await js.consumer_info(stream, durable)).config
        deliver_policy, start_sequence = started.deliver_policy, started.opt_start_seq
    except NotFoundError:
        deliver_policy = api.DeliverPolicy.ALL if start_sequence is None else api.DeliverPolicy.BY_START_SEQUENCE
    config = api.ConsumerConfig(
        durable_name=durable, filter_subject=filter_subject, ack_policy=api.AckPolicy.EXPLICIT,
        deliver_policy=deliver_policy, opt_start_seq=start_sequence, ack_wait=5 if in_order else 30,
        max_ack_pending=1 if in_order else 1000,
    )
    await js.add_consumer(stream, config)  # creates it, or updates one created with other settings


async def ensure_thread_partition_consumers(js: JetStreamContext) -> None:
    """Create each partition's in-order consumer. Where a service of the earlier layout left its
    single consumer of BB_THREADS, the partitions start where it stopped: at its first
    unacknowledged event, which it may have handled already (handlers take an event twice
    safely), so no event is lost and none handled earlier is taken again. That consumer is
    deleted only once every partition's exists, so a crash in between repeats the same start."""
    try:
        single = await js.consumer_info(subjects.THREADS_STREAM, subjects.RETIRED_THREADS_CONSUMER)
        start_sequence: int | None = single.ack_floor.stream_seq + 1
    except NotFoundError:
        single, start_sequence = None, None
    for partition in range(subjects.THREAD_PARTITIONS):
        await ensure_consumer(js, subjects.THREAD_PARTITIONS_STREAM, subjects.thread_partition_consumer(partition),
                              subjects.thread_partition(partition), in_order=True, start_sequence=start_sequence)
    if single is not None:
        await js.delete_consumer(subjects.THREADS_STREAM, subjects.RETIRED_THREADS_CONSUMER)


async def retire_provisioner_consumer(js: JetStreamContext) -> None:
    """Delete the provisioner's own log consumer that an earlier service left. What it had not
    acknowledged needs no hand-over: that consumer only ever drove environments on from their
    recorded state, and once the relay has caught up after a start the sweep drives every
    environment whose log has not ended, which covers each event it still held."""
    try:
        await js.delete_consumer(subjects.ENVIRONMENTS_STREAM, subjects.RETIRED_PROVISIONER_CONSUMER)
    except NotFoundError:
        pass


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
            self._open, self._failure = 0, APIError(code=int(status), description=headers.get(api.Header.DESCRIPTION, ""))
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
            except asyncio.TimeoutError:
                pass
        taken, self._arrived = self._arrived[:batch], self._arrived[batch:]
        return taken

    async def _request(self, batch: int) -> None:
        request = {"batch": batch, "expires": int(PULL_EXPIRES_S * 1e9)}
        self._open, self._open_until = batch, time.monotonic() + PULL_EXPIRES_S + _LOST_AFTER_S
        self._connection = self._nc.stats["reconnects"]
        await self._nc.publish(self._next, json.dumps(request).encode(), reply=self._inbox)


Binder = Callable[[JetStream, str, str], Awaitable[Fetcher]]


async def consume(js: JetStream, stream: str, durable: str, filter_subject: str, handle: Handler,
                  health: BusHealth, batch: int = 200, in_order: bool = False, *,
                  bind: Binder = PullFeed.bind) -> None:
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
        except (NatsTimeout, asyncio.TimeoutError):
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


async def follow(js: JetStreamContext, stream: str, filter_subject: str, after: Callable[[], Awaitable[int]],
                 handle: Handler, health: BusHealth, name: str, batch: int = 200) -> None:
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
                filter_subject, stream=stream, ordered_consumer=True, idle_heartbeat=FOLLOW_HEARTBEAT_S,
                config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start))
        except BUS_UNAVAILABLE as error:
            await bus.pause(error)
            continue
        try:
            await _follow_until_failed(subscription, handle, bus, backoff, batch)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


async def _follow_until_failed(subscription: JetStreamContext.PushSubscription, handle: Handler, bus: Retry,
                               backoff: Backoff, batch: int) -> None:
    while True:
        try:
            messages = [await subscription.next_msg(timeout=1)]
        except (NatsTimeout, asyncio.TimeoutError):
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
