"""`bb events replay` against a real `bb serve`: it succeeds while the service is busy, list never
shows a partly rebuilt model, and a service killed in the middle of a replay comes back with
complete read models."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bb_environments.bus.wire.api_messages import ListEnvironments, SpawnThread, ThreadRef
from tests.integration.conftest import Service, service_environment

REPLAYS = 4


async def spawn(service: Service, thread_id: str) -> str:
    spawned = await service.api.call(
        "threads", "spawn", SpawnThread(thread_id=thread_id, environment_provider="personal-workspace")
    )
    return spawned["environmentId"]


async def archive(service: Service, thread_id: str) -> None:
    await service.api.call("threads", "archive", ThreadRef(thread_id=thread_id))


async def listed(service: Service) -> list[dict]:
    """What `environment list --all` shows, page after page."""
    environments: list[dict] = []
    after = None
    while True:
        page = await service.api.call("environments", "list", ListEnvironments(include_removed=True, after=after))
        environments.extend(page["environments"])
        if not (after := page.get("next")):
            return environments


async def settled(service: Service, expected: dict[str, str], timeout: float = 120) -> list[dict]:
    """The list once every environment in `expected` has its expected status and the log is
    quiet (every ready workspace measured)."""
    deadline = time.monotonic() + timeout
    while True:
        environments = await listed(service)
        statuses = {e["id"]: e["status"] for e in environments}
        if all(statuses.get(i) == status for i, status in expected.items()):
            await service.measured()
            return await listed(service)
        if time.monotonic() > deadline:
            raise AssertionError(f"environments never settled: {statuses}")
        await asyncio.sleep(0.1)


async def test_replays_while_the_service_is_busy_all_succeed_and_list_never_loses_an_environment(service):
    for n in range(30):
        await spawn(service, f"pre{n}")
    replays_done = asyncio.Event()
    expected: dict[str, str] = {}
    lists_seen: list[int] = []

    async def keep_busy() -> None:
        """Spawn a thread after another, archiving each one two spawns later."""
        n = 0
        while not replays_done.is_set():
            expected[await spawn(service, f"busy{n}")] = "ready"
            if n >= 2:
                await archive(service, f"busy{n - 2}")
            n += 1

    async def watch_list() -> None:
        seen: set[str] = set()
        while not replays_done.is_set():
            now = {e["id"] for e in await listed(service)}
            assert seen <= now, f"list lost {len(seen - now)} of the {len(seen)} environments it had shown"
            seen = now
            lists_seen.append(len(now))

    busy, watching = asyncio.create_task(keep_busy()), asyncio.create_task(watch_list())
    try:
        replays = [await service.bb("events", "replay", "--json") for _ in range(REPLAYS)]
    finally:
        replays_done.set()
    await busy
    await watching

    for replay in replays:
        assert replay.returncode == 0 and not replay.stderr, replay.stderr
    events = [replay.json()["events"] for replay in replays]
    assert events == sorted(events) and events[0] < events[-1], events  # the service wrote meanwhile
    assert len(lists_seen) > REPLAYS

    # Quiet again (all but the last two busy threads were archived): the rebuilt model is the
    # live one, order included.
    live = await settled(service, {**expected, **{i: "removed" for i in list(expected)[:-2]}})
    replayed = await service.bb("events", "replay", "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert await listed(service) == live


@pytest.mark.parametrize("crash_at", ["replay-built", "replay-swapped"])
async def test_a_service_killed_in_the_middle_of_a_replay_restarts_with_complete_read_models(
    tmp_path: Path, crash_at: str
):
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir, BB_CRASH_AT=crash_at))
    await service.start()
    try:
        expected = {}
        for n in range(30):
            expected[await spawn(service, f"t{n}")] = "ready"
        for n in range(0, 30, 2):
            await archive(service, f"t{n}")
        expected.update({i: "removed" for i in list(expected)[::2]})
        environments = await settled(service, expected)
        threads = (await service.bb("thread", "list", "--json")).json()

        replay = await service.bb("events", "replay")
        assert replay.returncode == 4, replay.stderr  # the service died with the request
        assert service.process.wait(timeout=30) == -9

        service.environment = service_environment(data_dir)
        await service.start()
        assert await listed(service) == environments
        for environment in environments:
            shown = await service.show(environment["id"])
            assert (shown["status"], shown["version"]) == (environment["status"], environment["version"])
        assert (await service.bb("thread", "list", "--json")).json() == threads
        assert not (data_dir / "read-models.sqlite.rebuilding").exists()

        replayed = await service.bb("events", "replay", "--json")
        assert replayed.returncode == 0, replayed.stderr
        assert await listed(service) == environments
    finally:
        await service.stop()


async def test_replay_with_the_service_stopped_rebuilds_the_read_models_from_the_store_with_the_same_counts(service):
    ready = await spawn(service, "t1")
    removed = await spawn(service, "t2")
    await archive(service, "t2")
    await settled(service, {ready: "ready", removed: "removed"})
    while_serving = await service.bb("events", "replay", "--json")
    assert while_serving.returncode == 0, while_serving.stderr
    await service.stop()
    (service.data_dir / "read-models.sqlite").unlink()  # lost while stopped: the replay makes it again

    stopped = await service.bb("events", "replay", "--json")
    human = await service.bb("events", "replay")

    assert stopped.returncode == 0, stopped.stderr
    assert stopped.json() == while_serving.json()
    counts = stopped.json()
    assert human.stdout == (
        f"replayed {counts['events']} events: {counts['environments']} environments, {counts['threads']} threads\n"
    ), human.stderr
    await service.start()  # its read models are there: it rebuilds nothing, and answers from them
    assert "rebuilt them from the log" not in service.log_tail()
    assert {e["id"]: e["status"] for e in await listed(service)} == {ready: "ready", removed: "removed"}


async def test_replay_of_a_data_dir_nothing_was_served_from_is_not_found_and_creates_nothing(tmp_path: Path):
    data_dir = tmp_path / "never-served"

    replayed = await Service(data_dir, service_environment(data_dir)).bb("events", "replay", "--json")

    assert replayed.returncode == 3, replayed.stderr
    assert "there is no event store at" in replayed.json()["error"]["message"]
    assert not data_dir.exists()
