"""Core replicas on one store and one NATS (SPEC 7.2): who is running, and who does which share.

Each replica writes its presence into the replicas' bucket every few seconds; the bucket forgets a
key a few seconds after its last write, so what the bucket holds is who is running. A replica
starting with an id that is present is refused unless that presence is its own earlier run
(same machine and data dir, whose lock it holds now) or is not written again for a while (a
replica killed a moment ago).

The relay and the driving of each partition of the environments are leases: a key of the leases'
bucket, taken with `create` (refused while another holds it), renewed with a compare-and-set on its
revision, and forgotten by the bucket a few seconds after its holder stopped renewing it. A lease
only saves doubled work: every effect is fenced where it lands (the stream's expected last
sequence for the relay, optimistic concurrency in the store, operation ids at the agents). The
relay also confirms its lease in the bucket before each window it publishes (`Lease.confirmed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from bb_environments.bus.health import BusHealth, Retry
from bb_environments.bus.streams import ensure_bucket
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.replica_messages import EnvironmentActivity, LeaseHolder, ReplicaPresence
from bb_environments.domain.errors import DomainError

log = logging.getLogger(__name__)
T = TypeVar("T")

PRESENCE_TTL_S = 6.0
BEAT_S = 2.0
LEASE_TTL_S = 6.0
"""A lease outlives its holder's last renewal by this long: the longest a dead or stopped holder's
share waits for another replica."""
RENEW_S = 2.0
_SAFETY_S = 1.0
"""A holder takes its lease as lost this long before the bucket would forget it: its clock and
the server's may differ, and it may have been stopped meanwhile."""

_presence_decoder = msgspec.json.Decoder(ReplicaPresence)
_activity_decoder = msgspec.json.Decoder(EnvironmentActivity)


class ReplicaRefused(RuntimeError):
    """This replica must not run beside the ones running; the message says why, in one sentence."""


async def join(
    js: JetStreamContext, replica_id: str, data_dir: str, store: str, replicas: int, health: BusHealth
) -> Presence:
    """Enter this replica's presence, or refuse it (ReplicaRefused); a cluster still forming is
    waited for (replicas started together make the bucket together)."""
    bucket = await health.once_answered(
        "the replicas' presence bucket",
        lambda: ensure_bucket(
            js, api.KeyValueConfig(bucket=subjects.REPLICAS_BUCKET, history=1, ttl=PRESENCE_TTL_S, replicas=replicas)
        ),
    )
    own = ReplicaPresence(
        replica_id=replica_id,
        pid=os.getpid(),
        machine=socket.gethostname(),
        data_dir=data_dir,
        store=store,
        started_at=datetime.now(UTC).isoformat(),
    )
    for present in await health.once_answered("the replicas' presence", lambda: _present(js, bucket)):
        if present.replica_id == replica_id:
            await _refuse_if_running(bucket, present, own)
        elif "sqlite" in (store, present.store):
            raise ReplicaRefused(
                f"replica {present.replica_id} (pid {present.pid} on {present.machine}) runs on this NATS, and "
                f"an SQLite event store has one replica only: run replicas on one PostgreSQL store "
                "(BB_EVENT_STORE=postgresql://...), each with its own --replica-id and data dir"
            )
    presence = Presence(bucket, own)
    await health.once_answered("the replicas' presence", presence.enter)
    return presence


async def _present_keys(js: JetStreamContext) -> list[str]:
    """The keys the replicas' bucket holds now: one per replica running (or killed moments ago).
    One request, where listing a bucket's keys would make and delete a consumer each time."""
    info = await js.stream_info(f"KV_{subjects.REPLICAS_BUCKET}", subjects_filter=f"$KV.{subjects.REPLICAS_BUCKET}.>")
    return [subject.rpartition(".")[2] for subject in (info.state.subjects or {})]


async def present_replicas(js: JetStreamContext) -> list[ReplicaPresence]:
    """Every replica running now (or killed moments ago), for `replicas.list`."""
    return await _present(js, await js.key_value(subjects.REPLICAS_BUCKET))


async def _present(js: JetStreamContext, bucket: KeyValue) -> list[ReplicaPresence]:
    found = []
    for key in await _present_keys(js):
        with contextlib.suppress(KeyNotFoundError, msgspec.DecodeError):
            entry = await bucket.get(key)
            found.append(_presence_decoder.decode(entry.value or b""))
    return found


async def _refuse_if_running(bucket: KeyValue, present: ReplicaPresence, own: ReplicaPresence) -> None:
    if (present.machine, present.data_dir) == (own.machine, own.data_dir):
        return  # an earlier run of this very replica: this one holds its data dir's lock now
    first = await bucket.get(own.replica_id)
    await asyncio.sleep(2.5 * BEAT_S)
    with contextlib.suppress(KeyNotFoundError):
        if (await bucket.get(own.replica_id)).revision != first.revision:
            raise ReplicaRefused(
                f"replica {own.replica_id} is running already (pid {present.pid} on {present.machine}, data dir "
                f"{present.data_dir}): give each replica its own --replica-id (BB_REPLICA_ID)"
            )


class Presence:
    """This replica's key in the replicas' bucket, written again every BEAT_S while it runs."""

    def __init__(self, bucket: KeyValue, own: ReplicaPresence) -> None:
        self._bucket = bucket
        self._own = msgspec.json.encode(own)
        self.replica_id = own.replica_id

    async def enter(self) -> None:
        await self._bucket.put(self.replica_id, self._own)

    async def run(self, health: BusHealth) -> None:
        bus = health.retry("replica presence")
        while True:
            await asyncio.sleep(BEAT_S)
            await _asked(bus, lambda: self._bucket.put(self.replica_id, self._own), lambda: 0)

    async def leave(self) -> None:
        with contextlib.suppress(Exception):
            await self._bucket.delete(self.replica_id)


class Lease:
    """One key of the leases' bucket, held by this run of this replica or not."""

    def __init__(self, bucket: KeyValue, key: str, holder: LeaseHolder) -> None:
        self._bucket = bucket
        self.key = key
        self._holder = msgspec.json.encode(holder)
        self._revision: int | None = None
        self._valid_until = 0.0

    @property
    def held(self) -> bool:
        return self._revision is not None and time.monotonic() < self._valid_until

    async def confirmed(self) -> bool:
        """Whether this run holds the lease now by the bucket's word as well as its own clock: the
        key's latest revision is this run's (its value carries this run's token; a renewal still in
        flight may have moved the revision on) and not older than the last one it wrote."""
        if not self.held:
            return False
        try:
            entry = await self._bucket.get(self.key)
        except KeyNotFoundError:  # forgotten (its holder stopped renewing it) or given up
            return False
        return entry.value == self._holder and (entry.revision or 0) >= (self._revision or 0) and self.held

    async def take(self) -> bool:
        """Take the lease if nobody holds it; True if this replica holds it now."""
        if await self.renew():
            return True
        return await self._written(lambda: self._bucket.create(self.key, self._holder))

    async def renew(self) -> bool:
        """Keep the lease: a compare-and-set on the revision this run wrote last, which the bucket
        takes only if nobody wrote the key since and it was not forgotten. Tried also when this
        run's own clock says the lease lapsed (its renewals came late: a long pause, an election of
        the bucket's leader): the bucket, not the clock, says whether another took it. False (and
        not held from now on) if another did, or it was forgotten."""
        if self._revision is None:
            return False
        return await self._written(lambda: self._bucket.update(self.key, self._holder, last=self._revision))

    async def _written(self, write: Callable[[], Awaitable[int]]) -> bool:
        """Whether `write` (a create or compare-and-set) kept the key this replica's: it is held
        from the moment it was asked, not answered, for the lease's time."""
        asked = time.monotonic()
        try:
            self._revision = await write()
        # A create refused for a key that was there, which nats-py then looks up (to take it over if
        # it was deleted) and finds expired: nobody's now, and the next round's create takes it.
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            self._revision = None
            return False
        self._valid_until = asked + LEASE_TTL_S - _SAFETY_S
        return True

    async def give_up(self) -> None:
        revision, self._revision = self._revision, None
        if revision is not None:
            with contextlib.suppress(KeyWrongLastSequenceError, NotFoundError):
                await self._bucket.delete(self.key, last=revision)


async def leases_bucket(js: JetStreamContext, replicas: int, health: BusHealth) -> KeyValue:
    return await health.once_answered(
        "the leases' bucket",
        lambda: ensure_bucket(
            js, api.KeyValueConfig(bucket=subjects.LEASES_BUCKET, history=1, ttl=LEASE_TTL_S, replicas=replicas)
        ),
    )


def lease_holder(replica_id: str) -> LeaseHolder:
    return LeaseHolder(replica_id=replica_id, token=secrets.token_hex(8))


async def while_leased(
    lease: Lease,
    work: Callable[[], Coroutine[Any, Any, None]],
    health: BusHealth,
    on_others: Callable[[], None] = lambda: None,
) -> None:
    """Run `work` only while this replica holds `lease`: take it when free, renew it, and cancel
    `work` as soon as it is lost (or this replica cannot tell: it was stopped, or the bus is away
    past the lease). `on_others` is called each time another replica is seen holding it."""
    bus = health.retry(f"lease {lease.key}")
    running: asyncio.Task[None] | None = None
    try:
        while True:
            holds = await _asked(bus, lease.take, lambda: lease.held)
            if holds and running is None:
                log.info("took lease %s", lease.key)
                running = asyncio.create_task(work())
            elif not holds and running is not None:
                log.warning("lost lease %s: another replica has it now, or the bucket could not say in time", lease.key)
                await _cancelled(running)
                running = None
            elif not holds:
                on_others()
            if running is not None and running.done():
                running.result()  # its failure is the service's
            await asyncio.sleep(RENEW_S)
    finally:
        if running is not None:
            await _cancelled(running)
        await lease.give_up()


async def _asked(bus: Retry, ask: Callable[[], Awaitable[T]], meanwhile: Callable[[], T]) -> T:
    """`ask()`'s answer, told to the bus's health; while the bus is away, `meanwhile()`: what this
    replica can tell without it."""
    try:
        answer = await ask()
    except (TimeoutError, NatsError) as away:
        bus.failed(away)
        return meanwhile()
    bus.succeeded()
    return answer


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def drive_partition(aggregate_id: UUID) -> int:
    """An environment's drive partition: fixed by its id, the same on every replica."""
    return aggregate_id.int % subjects.DRIVE_PARTITIONS


class DriveShare:
    """The partitions of the environments this replica drives: a fair share of them, each under a
    lease, so that each environment is driven by one replica at a time and a dead replica's
    partitions pass to the others within LEASE_TTL_S."""

    def __init__(self, bucket: KeyValue, holder: LeaseHolder, live_replicas: Callable[[], Awaitable[int]]) -> None:
        self._leases = [Lease(bucket, subjects.drive_lease(p), holder) for p in range(subjects.DRIVE_PARTITIONS)]
        self._live_replicas = live_replicas
        self._held: frozenset[int] = frozenset()
        # Each replica starts its search for free partitions elsewhere, so that two starting at once
        # do not race for the same keys.
        self._first = int.from_bytes(holder.token.encode()[:4], "big") % subjects.DRIVE_PARTITIONS

    def drives(self, aggregate_id: UUID) -> bool:
        partition = drive_partition(aggregate_id)
        return partition in self._held and self._leases[partition].held

    async def run(self, health: BusHealth, gained: Callable[[], Awaitable[None]], lost: Callable[[], None]) -> None:
        """Keep a fair share: `gained` runs after partitions were taken (a sweep of what they
        hold), `lost` after some were lost or given up (stop driving what they hold)."""
        bus = health.retry("drive leases")
        # The sweep runs beside the renewals: with a backlog it takes longer than a lease lasts,
        # and leases not renewed meanwhile lapsed, were taken again, and swept again.
        sweep_due = asyncio.Event()
        sweeping = asyncio.create_task(_sweeps(sweep_due, gained))
        try:
            while True:
                held = await _asked(bus, self._rebalance, lambda: {p for p in self._held if self._leases[p].held})
                newly, gone = held - self._held, self._held - held
                self._held = frozenset(held)
                if gone:
                    log.info("no longer drives partitions %s", sorted(gone))
                    lost()
                if newly:
                    log.info("drives partitions %s", sorted(newly))
                    sweep_due.set()
                await asyncio.sleep(RENEW_S)
        finally:
            await _cancelled(sweeping)
            for partition in self._held:
                await self._leases[partition].give_up()

    async def _rebalance(self) -> set[int]:
        kept = {p for p in self._held if await self._leases[p].renew()}
        share = math.ceil(subjects.DRIVE_PARTITIONS / max(1, await self._live_replicas()))
        for partition in sorted(kept, reverse=True)[: max(0, len(kept) - share)]:
            await self._leases[partition].give_up()  # another replica joined: its share is left to it
            kept.discard(partition)
        for step in range(subjects.DRIVE_PARTITIONS):
            if len(kept) >= share:
                break
            partition = (self._first + step) % subjects.DRIVE_PARTITIONS
            if partition not in kept and await self._leases[partition].take():
                kept.add(partition)
        return kept


async def _sweeps(due: asyncio.Event, sweep: Callable[[], Awaitable[None]]) -> None:
    """Sweep each time partitions were gained, once for all gained while the last sweep ran."""
    while True:
        await due.wait()
        due.clear()
        try:
            await sweep()
        except Exception:  # the store away, say: the periodic sweep drives them all the same
            log.exception("sweeping the partitions this replica took failed")


async def live_replica_count(js: JetStreamContext) -> int:
    return len(await _present_keys(js))


class ActivityAcrossReplicas:
    """A thread's activity on an environment another replica drives, told on the bus: every replica
    hears it and the one that drives the environment takes it (Provisioner.heard_activity). Lost
    in a failover, it costs at most an early pause, which the thread's next message resumes (a
    paused environment's resume is asked in the log, not here)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc

    async def tell_driver(self, environment_id: UUID) -> None:
        with contextlib.suppress(NatsError):  # as if lost: see above
            await self._nc.publish(subjects.ACTIVITY, msgspec.json.encode(EnvironmentActivity(str(environment_id))))

    async def hear(self, heard: Callable[[UUID], Awaitable[None]]) -> Subscription:
        async def told(message: Msg) -> None:
            try:
                environment_id = UUID(_activity_decoder.decode(message.data).environment_id)
            except (msgspec.DecodeError, ValueError) as unreadable:
                log.warning("ignored a message on %s: %s", subjects.ACTIVITY, unreadable)
                return
            try:
                await heard(environment_id)
            except DomainError as refused:
                log.warning("ignored a message on %s: %s", subjects.ACTIVITY, refused)
            except Exception:
                log.exception("driving environment %s on a thread's activity failed", environment_id)

        return await self._nc.subscribe(subjects.ACTIVITY, cb=told)
