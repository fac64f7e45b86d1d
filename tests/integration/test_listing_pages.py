"""Listings larger than one NATS message: the API pages them and the CLI follows the pages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bb_environments.bus.embedded_server import EmbeddedNats
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import EnvironmentRef, SpawnThread
from tests.integration.conftest import Service, service_environment

MAX_PAYLOAD = 16 * 1024
THREADS = 60
"""Each environment's document takes some 600 bytes: sixty of them cannot go in one 16 KiB message."""


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[str]:
    """A nats-server whose messages may carry at most MAX_PAYLOAD bytes."""
    configuration = tmp_path / "nats.conf"
    configuration.write_text(json.dumps({"max_payload": MAX_PAYLOAD}))
    server = EmbeddedNats.start(tmp_path / "small-nats", configuration=configuration)
    try:
        yield f"nats://127.0.0.1:{server.port}"
    finally:
        server.stop()


async def test_lists_longer_than_one_message_come_whole(small_nats, tmp_path):
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_NATS_URL=small_nats))
    await service.start()
    try:
        spawned = [
            await service.api.call(
                "threads", "spawn", SpawnThread(thread_id=f"t{i:03d}", environment_provider="personal-workspace")
            )
            for i in range(THREADS)
        ]
        last = max(spawned, key=lambda s: s["position"])
        # Read-your-writes: once the last spawn's position is in the read model, all of them are.
        await service.api.call(
            "environments", "show", EnvironmentRef(environment_id=last["environmentId"], min_position=last["position"])
        )

        environments = await service.bb("environment", "list", "--json")
        assert environments.returncode == 0, environments.stderr
        listed = environments.json()
        assert list(listed) == ["environments"]
        assert len(json.dumps(listed["environments"])) > MAX_PAYLOAD, "the test needs more environments"
        assert sorted(e["id"] for e in listed["environments"]) == sorted(s["environmentId"] for s in spawned)

        threads = await service.bb("thread", "list", "--json")
        assert threads.returncode == 0, threads.stderr
        assert list(threads.json()) == ["threads"]
        assert [t["id"] for t in threads.json()["threads"]] == [f"t{i:03d}" for i in range(THREADS)]

        # A raw request for as many as a page may hold gets what fits, and where to go on from.
        nc = await service.connect("operator")
        try:
            reply = await nc.request(subjects.api("environments", "list"), b'{"limit": 1000}', timeout=30)
        finally:
            await nc.close()
        page = json.loads(reply.data)
        assert 0 < len(page["environments"]) < THREADS
        assert page["next"] == page["environments"][-1]["id"]
    finally:
        await service.stop()
