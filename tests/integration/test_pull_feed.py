"""The consumers' pull feed against a real nats-server: one open pull request brings messages as
they are published, a fetch hands over all that arrived, an expired request is renewed, and a
consumer deleted under the feed is reported as an error rather than waited on in silence, and the
consumer that reads through a feed makes a deleted durable again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.js import api
from nats.js.errors import APIError

from bb_environments.bus import jetstream
from bb_environments.bus.health import BusHealth
from bb_environments.bus.jetstream import JetStream, PullFeed, consume
from bb_environments.bus.streams import ensure_consumer
from tests.integration.conftest import eventually, plain_jetstream


@pytest.fixture
async def js(tmp_path: Path) -> AsyncIterator[JetStream]:
    async with plain_jetstream(
        tmp_path / "nats", api.StreamConfig(name="S", subjects=["s.>"], storage=api.StorageType.FILE)
    ) as context:
        yield context


@contextlib.asynccontextmanager
async def consumed_in_order(js: JetStream) -> AsyncIterator[list[bytes]]:
    """What an in-order `consume` of the stream hands over while the block runs, as it comes."""
    handled: list[bytes] = []

    async def handle(messages: list) -> None:
        handled.extend(message.data for message in messages)

    consuming = asyncio.create_task(consume(js, "S", "c", "s.>", handle, BusHealth(), in_order=True))
    try:
        yield handled
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)


async def test_an_in_order_consumer_is_handed_each_message_once_in_order_as_it_comes(js: JetStream) -> None:
    handled: list[bytes] = []
    batches: list[int] = []
    busy = asyncio.Event()

    async def handle(messages: list) -> None:
        batches.append(len(messages))
        handled.extend(message.data for message in messages)
        await busy.wait()  # the first batch is held until the rest has been published

    consuming = asyncio.create_task(consume(js, "S", "c", "s.>", handle, BusHealth(), in_order=True))
    try:
        await js.publish("s.a", b"0")
        await eventually(lambda: handled == [b"0"], "the first message, while nothing else waits")
        for i in range(1, 30):
            await js.publish(f"s.{i % 3}", str(i).encode())
        busy.set()
        await eventually(lambda: len(handled) == 30, "every message")
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
    assert handled == [str(i).encode() for i in range(30)]
    assert set(batches) == {1}  # in order: the next only once the last is acknowledged


async def test_a_published_message_dressed_as_a_server_status_is_handed_over_and_blocks_nothing(js: JetStream) -> None:
    # What any publisher could send: an empty body with the header the server's status messages carry.
    async with consumed_in_order(js) as handled:
        await js.publish("s.a", b"", headers={"Status": "404"})
        await js.publish("s.a", b"genuine")
        await eventually(lambda: handled == [b"", b"genuine"], "both messages handled, in order")


async def test_fetches_hand_over_what_arrived_in_order_and_an_expired_request_is_renewed(
    js: JetStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jetstream, "PULL_EXPIRES_S", 0.2)
    # Only the server's word that a request expired renews it within these fetches' timeouts: the
    # feed's own deadline for a request it never heard the end of lies far beyond them.
    monkeypatch.setattr(jetstream, "_LOST_AFTER_S", 60.0)
    await ensure_consumer(js, "S", "c", "s.>", in_order=False)
    feed = await PullFeed.bind(js, "c", "S")
    with pytest.raises(nats.errors.TimeoutError):
        await feed.fetch(100, timeout=0.5)  # nothing yet: the request expired and was asked again
    for i in range(10):
        await js.publish("s.x", str(i).encode())
    fetched: list = []
    while len(fetched) < 10:
        fetched += await feed.fetch(100, timeout=5)
    assert [m.data for m in fetched] == [str(i).encode() for i in range(10)]
    for message in fetched:
        await message.ack()

    await eventually(lambda: feed._open == 0, "the open request expired with nothing to bring")
    await js.publish("s.x", b"late")
    assert [m.data for m in await feed.fetch(100, timeout=5)] == [b"late"]


async def test_a_consumer_deleted_under_the_feed_is_an_error_not_a_silent_wait(js: JetStream) -> None:
    await ensure_consumer(js, "S", "c", "s.>", in_order=False)
    feed = await PullFeed.bind(js, "c", "S")
    fetching = asyncio.create_task(feed.fetch(100, timeout=30))
    await asyncio.sleep(0)  # the fetch sends its request...
    await js.nc.flush()  # ...which the server has once it answers a ping sent after it
    await js.delete_consumer("S", "c")
    with pytest.raises((APIError, nats.errors.NoRespondersError)):
        await asyncio.wait_for(fetching, 10)


async def test_a_durable_deleted_under_a_running_consumer_is_made_again_and_what_comes_after_is_handled(
    js: JetStream,
) -> None:
    async with consumed_in_order(js) as handled:
        await js.publish("s.a", b"before")
        await eventually(lambda: handled == [b"before"], "the message published before the deletion")
        await js.delete_consumer("S", "c")
        await js.publish("s.a", b"after")
        await eventually(lambda: b"after" in handled, "the message published after the deletion")
        assert (await js.consumer_info("S", "c")).config.max_ack_pending == 1  # made again as it was
