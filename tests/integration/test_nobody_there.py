"""A request or publish that nobody takes for a moment is sent again, as a cluster's failover needs:
replicas reconnect to another node within about a second, a stream elects a new leader. Against a
real nats-server: the API's subject and the threads stream are taken only after a pause."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.js import api

from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.embedded_server import EmbeddedNats
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import ListEnvironments
from bb_environments.bus.wire.resending import ATTEMPT_S, NOBODY_THERE_PATIENCE_S
from bb_environments.bus.wire.service_errors import ServiceError
from bb_environments.client import Client

AWAY_S = 1.0  # about what a replica's reconnect to another node takes


@pytest.fixture
def server(tmp_path: Path):
    started = EmbeddedNats.start(tmp_path / "nats")
    yield started
    started.stop()


async def test_an_api_request_nobody_takes_yet_is_answered_once_a_replica_is_back(server):
    service = await nats.connect(server.url)
    client = await ApiClient.connect(server.url)
    try:
        asked = asyncio.ensure_future(client.call("environments", "list", ListEnvironments()))
        await asyncio.sleep(AWAY_S)  # the replicas are away while the request is first sent
        assert not asked.done()
        taken = 0

        async def answer(message) -> None:
            nonlocal taken
            taken += 1
            await message.respond(b'{"environments": []}')

        await service.subscribe(subjects.api("environments", "list"), cb=answer)
        assert await asyncio.wait_for(asked, 10) == {"environments": []}
        assert taken == 1
    finally:
        await client.close()
        await service.close()


async def test_an_api_request_its_taker_never_answers_is_sent_again_and_answered_by_another(server):
    """A replica killed or stopped with the request: it took it and never answers; the request
    sent again reaches the replica that answers."""
    service = await nats.connect(server.url)
    client = await ApiClient.connect(server.url)
    try:
        subject = subjects.api("environments", "list")
        swallowed = asyncio.Event()

        async def swallow(message) -> None:
            swallowed.set()
            await stalled.unsubscribe()  # its server finds it gone: it leaves the queue group

        stalled = await service.subscribe(subject, queue="replicas", cb=swallow)
        asked = asyncio.ensure_future(client.call("environments", "list", ListEnvironments()))
        await asyncio.wait_for(swallowed.wait(), 10)
        answered = 0

        async def answer(message) -> None:
            nonlocal answered
            answered += 1
            await message.respond(b'{"environments": []}')

        await service.subscribe(subject, queue="replicas", cb=answer)
        assert await asyncio.wait_for(asked, 15) == {"environments": []}
        assert answered == 1
    finally:
        await client.close()
        await service.close()


async def test_a_slow_answer_to_an_earlier_attempt_counts(server):
    service = await nats.connect(server.url)
    client = await ApiClient.connect(server.url)
    try:
        requests: list[str] = []

        async def answer_the_first_late(message) -> None:
            requests.append(message.reply)
            if len(requests) == 1:
                await asyncio.sleep(ATTEMPT_S * 1.5)  # the request is sent again meanwhile
                await message.respond(b'{"environments": ["late"]}')

        await service.subscribe(subjects.api("environments", "list"), cb=answer_the_first_late)
        assert await asyncio.wait_for(client.call("environments", "list", ListEnvironments()), 15) == {
            "environments": ["late"]
        }
        assert len(requests) == 2 and requests[0] == requests[1]  # sent again, to the same inbox
    finally:
        await client.close()
        await service.close()


async def test_an_api_request_nobody_ever_takes_is_unreachable_after_the_patience(server):
    client = await ApiClient.connect(server.url)
    try:
        started = time.monotonic()
        with pytest.raises(ServiceError, match="nothing answers the API"):
            await client.call("environments", "list", ListEnvironments())
        assert NOBODY_THERE_PATIENCE_S - 1 <= time.monotonic() - started < NOBODY_THERE_PATIENCE_S + 5
    finally:
        await client.close()


async def test_a_service_known_to_have_ended_is_unreachable_at_once(server):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    client = await ApiClient.connect(server.url, service_pid=ended.pid)
    try:
        started = time.monotonic()
        with pytest.raises(ServiceError, match="nothing answers the API"):
            await client.call("environments", "list", ListEnvironments())
        assert time.monotonic() - started < NOBODY_THERE_PATIENCE_S - 1
    finally:
        await client.close()


async def test_a_thread_event_no_stream_takes_yet_is_stored_once_the_stream_is_there(server):
    client = await Client.connect(url=server.url)
    admin = await nats.connect(server.url)
    try:
        archived = asyncio.ensure_future(client.archive("t1"))
        await asyncio.sleep(AWAY_S)  # no stream (leader) yet
        assert not archived.done()
        js = admin.jetstream()
        await js.add_stream(api.StreamConfig(name=subjects.THREADS_STREAM, subjects=[subjects.THREAD_EVENTS]))
        await asyncio.wait_for(archived, 10)
        assert (await js.stream_info(subjects.THREADS_STREAM)).state.messages == 1
    finally:
        await client.close()
        await admin.close()
