"""thread unarchive / cancel and events tail, through the CLI."""

from __future__ import annotations

import asyncio
import json
import sys

from tests.integration.conftest import Service, service_environment
from tests.integration.test_crash_recovery import GATED, open_gates, provider_dir, wait_for_call
from tests.support.gated_provider import calls


async def test_unarchiving_inside_the_grace_keeps_the_environment(tmp_path):
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_RETIRE_GRACE_MS="600000"))
    await service.start()
    try:
        spawned = await service.bb(
            "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1", "--wait", "--json"
        )
        environment_id = spawned.json()["environmentId"]
        await service.bb("thread", "archive", "t1")
        retiring = await service.wait_for(environment_id, "retiring")
        assert retiring["retireAt"] is not None
        assert (await service.bb("thread", "unarchive", "t1")).returncode == 0
        kept = await service.wait_for(environment_id, lambda e: e["threadIds"] == ["t1"])
        assert kept["status"] == "ready" and kept["retireAt"] is None
    finally:
        await service.stop()


async def test_cancelling_the_message_stops_a_preparing_environment(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_EXTRA_PROVIDERS=GATED))
    await service.start()
    try:
        await open_gates(service, "remove")
        environment_id = await service.spawn("gated", project=project, thread_id="t1")
        await wait_for_call(service, "create t1 1")
        assert (await service.bb("thread", "cancel", "t1")).returncode == 0
        await service.wait_for(environment_id, "removed")
        assert calls(provider_dir(service))[-1].startswith("remove t1")
        thread = (await service.bb("thread", "list", "--json")).json()["threads"][0]
        assert thread["status"] == "active" and thread["environmentId"] is None
    finally:
        await service.stop()


async def test_events_tail_prints_live_environment_events(service):
    tail = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bb_environments.entrypoints.bb",
        "events",
        "tail",
        "bb.environments.*.ready",
        "--json",
        env=service.environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        # Spawn until the tail (still starting up) has heard a readiness; each spawn is a new thread.
        for attempt in range(20):
            await service.bb(
                "thread",
                "spawn",
                "--environment-provider",
                "personal-workspace",
                "--thread-id",
                f"t{attempt}",
                "--wait",
            )
            try:
                line = await asyncio.wait_for(tail.stdout.readline(), 1)
            except TimeoutError:
                continue
            event = json.loads(line)
            assert event["type"] == "ready" and event["status"] == "ready"
            return
        raise AssertionError("events tail printed nothing")
    finally:
        tail.kill()
        await tail.wait()
