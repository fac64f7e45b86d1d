"""A burst of thread events cut by a SIGKILL while some are unacknowledged: after the restart every
thread ends as its own events, in the order it sent them, say, and none was handled twice.

Threads are handled side by side (one in-order consumer per partition of the thread ids), so the
kill finds several partitions each with an event in hand, one of them handled but not acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

import msgspec

from bb_environments.bus import subjects
from bb_environments.bus.api_messages import ListThreads
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
    service = Service(data_dir, service_environment(data_dir, BB_RETIRE_GRACE_MS=GRACE_MS,
                                                    BB_CRASH_AT=f"thread-event-handled#{total // 3}"))
    await service.start()
    try:
        publisher = await service.connect("publisher")
        js = publisher.jetstream()
        try:
            # Interleaved: each round publishes every thread's next event.
            for position in range(max(len(kinds) for kinds in sent.values())):
                for thread_id, kinds in sent.items():
                    if position < len(kinds):
                        body = {"type": kinds[position], "threadId": thread_id,
                                **({"environment": PERSONAL} if kinds[position] == "created" else {})}
                        await js.publish(subjects.thread_event(thread_id, kinds[position]), msgspec.json.encode(body))
        finally:
            await publisher.close()
        await eventually(lambda: service.process.poll() is not None, "the crash a third into the burst", 120)

        service.environment = service_environment(data_dir, BB_RETIRE_GRACE_MS=GRACE_MS)
        await service.start()
        await service.thread_events_handled(timeout=180)

        expected = {thread_id: "active" if kinds[-1] == "unarchived" else "archived" for thread_id, kinds in sent.items()}
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
