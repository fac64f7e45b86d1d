"""The streams, KV buckets and durable consumers the service makes, and the start's wait for a
cluster that is still forming.

Consumers are created explicitly (`add_consumer`), because `pull_subscribe` silently keeps an
existing consumer's old settings.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from bb_environments.bus.health import BusHealth, short_of_room
from bb_environments.bus.wire import subjects

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


def _streams(threads_max_age_s: float, threads_max_bytes: int) -> tuple[api.StreamConfig, ...]:
    return (
        # Thread events carry prompts: kept only within these limits. (The server refuses a
        # duplicate window longer than the age limit.)
        api.StreamConfig(
            name=subjects.THREADS_STREAM,
            subjects=[subjects.THREAD_EVENTS],
            storage=api.StorageType.FILE,
            duplicate_window=min(DUPLICATE_WINDOW_S, threads_max_age_s),
            max_age=threads_max_age_s,
            max_bytes=threads_max_bytes,
        ),
        # The same events, each under its thread's partition, for one in-order consumer per
        # partition. A mirror keeps the stream's sequence numbers and needs no server
        # configuration (an external NATS works as it is); it keeps what BB_THREADS keeps.
        api.StreamConfig(
            name=subjects.THREAD_PARTITIONS_STREAM,
            storage=api.StorageType.FILE,
            max_age=threads_max_age_s,
            max_bytes=threads_max_bytes,
            mirror=api.StreamSource(
                name=subjects.THREADS_STREAM,
                subject_transforms=[
                    api.SubjectTransform(src=source, dest=destination)
                    for source, destination in subjects.thread_partition_transforms()
                ],
            ),
        ),
        api.StreamConfig(
            name=subjects.ENVIRONMENTS_STREAM,
            subjects=[subjects.LOG_EVENTS],
            storage=api.StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
            republish=api.RePublish(src=subjects.LOG_ENVIRONMENT_EVENTS, dest=subjects.ENVIRONMENT_EVENTS),
        ),
        api.StreamConfig(
            name=subjects.TRANSCRIPTS_STREAM,
            subjects=[subjects.TRANSCRIPT_EVENTS],
            storage=api.StorageType.FILE,
            max_msgs_per_subject=TRANSCRIPT_LINES_PER_ENVIRONMENT,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
        # The hosts' agents' lines, each gone once the core has checked it and kept it in
        # BB_TRANSCRIPTS (or dropped it); a flood waiting here is bounded like the transcripts.
        api.StreamConfig(
            name=subjects.TRANSCRIPT_INTAKE_STREAM,
            subjects=[subjects.HOST_TRANSCRIPTS],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.WORK_QUEUE,
            max_msgs_per_subject=TRANSCRIPT_LINES_PER_ENVIRONMENT,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
        api.StreamConfig(
            name=subjects.PLACEMENTS_STREAM,
            subjects=[subjects.PLACEMENT_EVENTS],
            storage=api.StorageType.FILE,
            max_age=PLACEMENTS_MAX_AGE_S,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
        # A job is gone once its host's agent acknowledged it (after storing its report).
        api.StreamConfig(
            name=subjects.HOST_JOBS_STREAM,
            subjects=[subjects.HOST_JOBS],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.WORK_QUEUE,
            duplicate_window=HOST_JOBS_DUPLICATE_WINDOW_S,
        ),
        api.StreamConfig(
            name=subjects.HOST_REPORTS_STREAM,
            subjects=[subjects.HOST_REPORTS],
            storage=api.StorageType.FILE,
            max_msgs_per_subject=1,
            max_age=HOST_REPORTS_MAX_AGE_S,
            allow_direct=True,
        ),
    )


class NoRoomForStreams(RuntimeError):
    """The NATS servers cannot hold a stream the service needs; the message says which, the room it
    needs and what changes it, in one sentence."""


async def prepare_bus(
    js: JetStreamContext,
    health: BusHealth,
    threads_max_age_s: float,
    threads_max_bytes: int,
    replicas: int,
    host_id: str,
) -> None:
    """The streams, the thread partitions' consumers and the hosts' bucket a core needs before it
    starts, each waited for while the cluster forms (BusHealth.once_answered)."""
    await health.once_answered(
        "the streams", lambda: ensure_streams(js, threads_max_age_s, threads_max_bytes, replicas)
    )
    await health.once_answered("the thread partitions' consumers", lambda: ensure_thread_partition_consumers(js))
    await health.once_answered("the retired consumers", lambda: retire_provisioner_consumer(js))
    await health.once_answered("the hosts' bucket", lambda: ensure_hosts(js, [host_id], replicas))


async def ensure_streams(
    js: JetStreamContext, threads_max_age_s: float, threads_max_bytes: int, replicas: int = 1
) -> None:
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
    return (
        f"{servers} no room for stream {refused.name}: {why}, so give each server a max_file_store above "
        f"{_size(2 * threads_max_bytes)} or lower BB_THREADS_MAX_BYTES"
    )


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
        durable_name=subjects.host_jobs_consumer(host_id),
        filter_subject=subjects.host_jobs(host_id),
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=HOST_JOB_ACK_WAIT_S,
        max_ack_pending=1000,
    )
    await js.add_consumer(subjects.HOST_JOBS_STREAM, config)


async def ensure_consumer(
    js: JetStreamContext,
    stream: str,
    durable: str,
    filter_subject: str,
    in_order: bool,
    start_sequence: int | None = None,
) -> None:
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
        durable_name=durable,
        filter_subject=filter_subject,
        ack_policy=api.AckPolicy.EXPLICIT,
        deliver_policy=deliver_policy,
        opt_start_seq=start_sequence,
        ack_wait=5 if in_order else 30,
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
        await ensure_consumer(
            js,
            subjects.THREAD_PARTITIONS_STREAM,
            subjects.thread_partition_consumer(partition),
            subjects.thread_partition(partition),
            in_order=True,
            start_sequence=start_sequence,
        )
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
