"""Thread events are handled side by side across threads, one in-order consumer per partition of
the thread ids, and in order within each thread, also across a crash and across the upgrade from
the single consumer an earlier service read them with.

A burst cut by a SIGKILL finds several partitions each with an event in hand, one of them handled
but not acknowledged: after the restart every thread ends as its own events, in the order it sent
them, say, and none was handled twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest
from nats.js import api
from nats.js.errors import NotFoundError

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import ListThreads
from tests.integration.conftest import Service, eventually, service_environment

THREADS = 60
# Long enough that an archived thread's ready environment is still `retiring` when the test looks,
# and an unarchived one's retirement is visibly cancelled.
GRACE_MS = "600000"
PERSONAL = {"type": "provider", "environmentProviderId": "personal-workspace"}


def sent_by(index: int) -> list[str]:
    """What thread `index` publishes, in order: every third one comes back after its archive."""
    kinds = ["created", "message", "archived"]
    return [*kinds, "unarchived"] if index % 3 == 0 else kinds


async def test_a_burst_killed_midway_ends_every_thread_as_its_own_events_say(tmp_path: Path) -> None:
    sent = {f"burst{i}": sent_by(i) for i in range(THREADS)}
    total = sum(len(kinds) for kinds in sent.values())
    data_dir = tmp_path / "data"
    service = Service(
        data_dir,
        service_environment(data_dir, BB_RETIRE_GRACE_MS=GRACE_MS, BB_CRASH_AT=f"thread-event-handled#{total // 3}"),
    )
    await service.start()
    try:
        publisher = await service.connect("publisher")
        js = publisher.jetstream()
        try:
            # Interleaved: each round publishes every thread's next event.
            for position in range(max(len(kinds) for kinds in sent.values())):
                for thread_id, kinds in sent.items():
                    if position < len(kinds):
                        body = {
                            "type": kinds[position],
                            "threadId": thread_id,
                            **({"environment": PERSONAL} if kinds[position] == "created" else {}),
                        }
                        await js.publish(subjects.thread_event(thread_id, kinds[position]), msgspec.json.encode(body))
        finally:
            await publisher.close()
        await eventually(lambda: service.process.poll() is not None, "the crash a third into the burst", 120)

        service.environment = service_environment(data_dir, BB_RETIRE_GRACE_MS=GRACE_MS)
        await service.start()
        await service.thread_events_handled(timeout=180)

        expected = {
            thread_id: "active" if kinds[-1] == "unarchived" else "archived" for thread_id, kinds in sent.items()
        }
        threads = await _threads_once_settled(service, expected)
        assert {thread_id: thread["status"] for thread_id, thread in threads.items()} == expected

        listed = (await service.bb("environment", "list", "--all", "--json")).json()["environments"]
        assert len(listed) == THREADS  # one environment per first message, none made twice
        for thread_id, thread in threads.items():
            if expected[thread_id] == "archived":
                # Retiring when the archive came after ready, removed when it cancelled the provisioning.
                await service.wait_for(thread["environmentId"], lambda e: e["status"] in ("retiring", "removed"))
            elif thread["environmentId"] is not None:
                # Back before its grace ran out: the retirement was cancelled.
                await service.wait_for(thread["environmentId"], "ready")

        exported = await service.bb("events", "export")
        by_environment: dict[str, list[dict]] = defaultdict(list)
        for event in map(json.loads, exported.stdout.splitlines()):
            if "environmentId" in event and "threadIds" in event:
                by_environment[event["environmentId"]].append(event)
        assert len(by_environment) == THREADS
        for events in by_environment.values():
            types = [event["type"] for event in events]
            assert [event["version"] for event in events] == list(range(1, len(events) + 1))
            assert types.count("claimed") == 1 and types.count("created") <= 1
            assert types.count("setup_started") <= 1 and types.count("ready") <= 1
    finally:
        await service.stop()


async def _threads_once_settled(service: Service, expected: dict[str, str], timeout: float = 60) -> dict[str, dict]:
    """The threads as the read model lists them, once it shows the statuses expected (or at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = (await service.api.call("threads", "list", ListThreads()))["threads"]
        threads = {thread["id"]: thread for thread in listed}
        if {t: threads[t]["status"] for t in threads} == expected or time.monotonic() > deadline:
            return threads
        await asyncio.sleep(0.1)


async def test_the_partitions_take_over_where_the_single_consumer_of_an_earlier_service_stopped(
    service: Service,
) -> None:
    service.kill()  # its nats-server lives on: lay out the streams as an earlier service left them
    nc = await service.connect("service")
    js = nc.jetstream()
    publisher = await service.connect("publisher")
    try:
        await js.delete_stream(subjects.THREAD_PARTITIONS_STREAM)
        await js.add_consumer(
            subjects.THREADS_STREAM,
            api.ConsumerConfig(
                durable_name="threads",
                filter_subject=subjects.THREAD_EVENTS,
                ack_policy=api.AckPolicy.EXPLICIT,
                deliver_policy=api.DeliverPolicy.ALL,
                ack_wait=5,
                max_ack_pending=1,
            ),
        )
        single = await js.pull_subscribe_bind("threads", subjects.THREADS_STREAM)

        async def publish(thread_id: str) -> None:
            for kind, extra in (("created", {"environment": PERSONAL}), ("message", {})):
                body = {"type": kind, "threadId": thread_id, **extra}
                await publisher.jetstream().publish(subjects.thread_event(thread_id, kind), msgspec.json.encode(body))

        await publish("handled-before")
        for _ in range(2):  # as the earlier service did once it had handled them
            [message] = await single.fetch(1, timeout=5)
            await message.ack_sync()
        await publish("waiting")

        await service.start()
        waiting = await service.wait_for_thread("waiting", having="environmentId")
        await service.wait_for(waiting["environmentId"], "ready")
        await service.thread_events_handled()
        listed = (await service.api.call("threads", "list", ListThreads()))["threads"]
        assert [thread["id"] for thread in listed] == ["waiting"]  # what it acknowledged is not taken again
        with pytest.raises(NotFoundError):
            await js.consumer_info(subjects.THREADS_STREAM, "threads")
    finally:
        await publisher.close()
        await nc.close()
