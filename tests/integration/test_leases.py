"""The replicas' leases (bus/core/replicas.py) on a real nats-server's key-value bucket: the bucket,
not a replica's clock, says who holds one, and the sweep after partitions were taken holds up no
renewal of them (a backlog's sweep outlasted the leases, which lapsed, were taken again and swept
again: spawns stalled for tens of seconds after a replica's pause or a node's loss)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import pytest
from nats.js import JetStreamContext, api
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from bb_environments.bus.core import replicas
from bb_environments.bus.core.replicas import (
    LEASE_TTL_S,
    RENEW_S,
    DriveShare,
    Lease,
    lease_holder,
    leases_bucket,
    while_leased,
)
from bb_environments.bus.health import BusHealth
from bb_environments.bus.wire import subjects
from tests.integration.conftest import plain_jetstream


@pytest.fixture
async def js(tmp_path: Path) -> AsyncIterator[JetStreamContext]:
    async with plain_jetstream(tmp_path / "nats", api.StreamConfig(name="UNUSED", subjects=["unused"])) as jetstream:
        yield jetstream


def clock_ahead(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This process's clock as after a pause of `seconds` that the server did not see."""
    real = time.monotonic
    monkeypatch.setattr(replicas.time, "monotonic", lambda: real() + seconds)


async def test_a_lease_renewed_late_is_kept_when_nobody_took_it_and_lost_when_another_did(js, monkeypatch):
    bucket = await leases_bucket(js, 1, BusHealth())
    mine, theirs = Lease(bucket, "relay", lease_holder("a")), Lease(bucket, "relay", lease_holder("b"))
    assert await mine.take() and not await theirs.take()

    clock_ahead(monkeypatch, LEASE_TTL_S)  # past its time by its own clock: not held...
    assert not mine.held and not await mine.confirmed()
    assert await mine.renew() and mine.held  # ...but the bucket still has its revision: kept

    await bucket.delete("relay")  # forgotten, as the bucket does once its holder stops renewing
    assert await theirs.take()
    assert not await mine.renew() and not mine.held and not await mine.confirmed()
    assert await theirs.confirmed()


class ExpiredUnderTheFirstCreate:
    """The real bucket, whose first create meets the race nats-py turns into KeyNotFoundError: refused
    for a key that was there, which expired before nats-py looked it up again."""

    def __init__(self, bucket: KeyValue) -> None:
        self._bucket = bucket
        self.raced = False

    async def create(self, key: str, value: bytes) -> int:
        if not self.raced:
            self.raced = True
            raise KeyNotFoundError
        return await self._bucket.create(key, value)

    def __getattr__(self, name: str) -> object:
        return getattr(self._bucket, name)


async def test_a_lease_whose_key_expired_under_its_create_is_taken_next_round_and_the_replica_goes_on(js, caplog):
    # A replica woken from a pause exited on it: the error went to the bus's health as if the bus
    # were away, which could not read it.
    bucket = ExpiredUnderTheFirstCreate(await leases_bucket(js, 1, BusHealth()))
    lease = Lease(bucket, "relay", lease_holder("a"))  # type: ignore[arg-type]  # the real bucket, wrapped
    working = asyncio.Event()

    async def work() -> None:
        working.set()
        await asyncio.Event().wait()

    leased = asyncio.create_task(while_leased(lease, work, BusHealth()))
    try:
        await asyncio.wait_for(working.wait(), RENEW_S + 10)
        assert bucket.raced and not leased.done() and await lease.confirmed()
        assert not [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    finally:
        leased.cancel()
        await asyncio.gather(leased, return_exceptions=True)


async def test_partitions_stay_held_while_the_sweep_after_taking_them_runs_longer_than_a_lease(js):
    bucket = await leases_bucket(js, 1, BusHealth())
    share = DriveShare(bucket, lease_holder("a"), lambda: _one())
    sweeping, never = asyncio.Event(), asyncio.Event()

    async def long_sweep() -> None:
        sweeping.set()
        await never.wait()

    running = asyncio.create_task(share.run(BusHealth(), long_sweep, lambda: None))
    try:
        await asyncio.wait_for(sweeping.wait(), 10)
        await asyncio.sleep(LEASE_TTL_S + 2 * RENEW_S)  # a lease's time and two renewals into the sweep
        assert all(share.drives(UUID(int=partition)) for partition in range(subjects.DRIVE_PARTITIONS))
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def _one() -> int:
    return 1
