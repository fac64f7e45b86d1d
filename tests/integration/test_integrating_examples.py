"""The examples of README and docs/integrating.md (examples/integrating/*.py), run as written
against a real `bb serve`: a service getting a worktree for a thread, a publisher with the typed
client and with nats-py alone, a service reacting to outcomes, a subscriber; and the typed
client's promises beyond them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bb_environments.client import Client, EnvironmentFailed, InvalidId, PlacementRefused, ServiceNotFound
from tests.integration.conftest import Service, write_hooks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "integrating"


async def run_example(service: Service, name: str, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        *args,
        env=service.environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def running_example(service: Service, name: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """The example, started and listening (it printed `listening`)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        *args,
        env=service.environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), 30)
        assert first == b"listening\n", first + (await process.stderr.read() if process.stderr else b"")
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def line_with(process: asyncio.subprocess.Process, fragment: str, timeout: float = 60) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        line = (await asyncio.wait_for(process.stdout.readline(), max(0.1, deadline - time.monotonic()))).decode()
        assert line, f"the example ended before printing {fragment!r}"
        if fragment in line:
            return line


async def test_the_readme_example_gets_a_worktree_ready_for_its_thread_and_archives_it(service, git_repo):
    code, out, err = await run_example(service, "quickstart.py", "t1", str(git_repo))
    assert code == 0, err
    assert out.startswith("thread t1 is ready in environment "), out
    environment = await service.show(out.split()[-1])
    assert (environment["providerId"], environment["projectPath"]) == ("git-worktree", str(git_repo))
    assert (await service.wait_for(environment["id"], "removed"))["threadIds"] == []  # archived, so retired


async def test_the_client_example_spawns_waits_for_ready_prints_the_events_and_archives(service):
    code, out, err = await run_example(service, "with_the_client.py", "t1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("thread t1 is ready in environment "), out
    environment_id = lines[0].rsplit(" ", 1)[1]
    assert "  v1 claimed -> creating" in lines and any(line.endswith("ready -> ready") for line in lines), out
    assert (await service.wait_for(environment_id, "removed"))["threadIds"] == []  # archived, so retired


async def test_the_nats_py_example_publishes_created_and_message_and_hears_ready(service):
    code, out, err = await run_example(service, "with_nats_py.py", "t1")
    assert code == 0, err
    assert out.startswith("thread t1 is ready in environment "), out
    environment_id = out.split()[-1]
    assert (await service.show(environment_id))["threadIds"] == ["t1"]


async def test_the_nats_py_example_hears_a_refusal_with_its_reason(service):
    code, out, err = await run_example(service, "with_nats_py.py", "t1", "no-such-provider")
    assert code == 1, out + err
    assert out.startswith("not placed: refused: ") and "no-such-provider" in out, out


async def test_the_reacting_service_hears_every_threads_outcome_once(service):
    async with running_example(service, "react_to_outcomes.py") as reacting:
        for thread_id in ("t1", "t2"):
            spawned = await service.bb(
                "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", thread_id, "--json"
            )
            assert spawned.returncode == 0, spawned.stderr
            heard = await line_with(reacting, f"{thread_id}: ")
            assert heard == f"{thread_id}: ready in {spawned.json()['environmentId']}\n"


async def test_the_subscriber_example_hears_ready_and_reads_the_log_with_its_durable_consumer(service):
    async with running_example(service, "subscriber.py", "1") as subscriber:
        spawned = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--json")
        environment_id = spawned.json()["environmentId"]
        assert await line_with(subscriber, "ready: ") == f"ready: {environment_id}\n"
        assert await line_with(subscriber, "audit: ") == f"audit: {environment_id} v1 claimed\n"


async def test_wait_ready_hears_an_outcome_published_before_it_was_called(service):
    async with await Client.connect(service.data_dir) as client:
        await client.spawn("t1", provider="personal-workspace")
        environment = await service.wait_for(
            (await service.wait_for_thread("t1", "environmentId"))["environmentId"], "ready"
        )
        outcome = await client.wait_ready("t1", timeout=30)
        assert (outcome.status, outcome.environment_id, outcome.reason) == ("ready", environment["id"], None)
    async with await Client.connect(service.data_dir) as another:  # it did not spawn it: the newest outcome
        assert (await another.wait_ready("t1", timeout=30)).environment_id == environment["id"]


async def test_wait_ready_raises_naming_the_reason_of_a_refusal_and_of_a_failed_setup(service, git_repo, tmp_path):
    async with await Client.connect(service.data_dir) as client:
        await client.spawn("t1", provider="no-such-provider")
        with pytest.raises(PlacementRefused, match="thread t1 was refused: .*no-such-provider") as refused:
            await client.wait_ready("t1", timeout=30)
        assert refused.value.outcome.status == "refused"

        write_hooks(git_repo, tmp_path / "marker", setup="exit 3")
        await client.spawn("t2", provider="git-worktree", project=git_repo)
        with pytest.raises(EnvironmentFailed, match="of thread t2 failed: ") as failed:
            await client.wait_ready("t2", timeout=60)
        assert failed.value.outcome.environment_id and failed.value.outcome.status == "error"


async def test_wait_ready_times_out_with_the_thread_named(service):
    async with await Client.connect(service.data_dir) as client:
        with pytest.raises(TimeoutError, match="thread never-spawned heard no placement outcome within 0.5 s"):
            await client.wait_ready("never-spawned", timeout=0.5)


async def test_connect_without_a_service_says_so(tmp_path):
    with pytest.raises(ServiceNotFound, match="cannot find the bb service: no server.json"):
        await Client.connect(tmp_path / "nothing-served")


async def test_a_client_connected_before_a_restart_keeps_hearing_outcomes_after_it(service):
    async with await Client.connect(service.data_dir) as client:
        outcomes = client.placements()
        await client.spawn("t1", provider="personal-workspace")
        assert (await asyncio.wait_for(anext(outcomes), 60)).thread_id == "t1"

        await service.stop()  # its nats-server stops with it: the client's consumer is gone
        await service.start()
        await client.spawn("t2", provider="personal-workspace")  # published once the client is back
        heard = await asyncio.wait_for(anext(outcomes), 60)
        assert (heard.thread_id, heard.status) == ("t2", "ready")
        await outcomes.aclose()


async def test_ids_the_service_would_refuse_are_refused_before_anything_is_sent(service):
    async with await Client.connect(service.data_dir) as client:
        for thread_id in ("a/b", "", "x" * 129, "t.1"):
            with pytest.raises(InvalidId, match="thread id .* is not allowed: use 1-128 letters"):
                await client.spawn(thread_id, provider="personal-workspace")
            with pytest.raises(InvalidId):
                await client.archive(thread_id)
        with pytest.raises(InvalidId, match="host id 'h/1' is not allowed"):
            await client.spawn("t1", provider="personal-workspace", host="h/1")
    assert (await service.bb("thread", "list", "--json")).json()["threads"] == []


async def test_a_spawn_sent_again_makes_no_second_environment_and_wait_ready_returns_its_outcome(service):
    async with await Client.connect(service.data_dir) as client:
        await client.spawn("t1", provider="personal-workspace")
        first = await client.wait_ready("t1", timeout=60)
        await client.spawn("t1", provider="personal-workspace")  # a natural retry
        again = await client.wait_ready("t1", timeout=30)
        assert (again.status, again.environment_id) == ("ready", first.environment_id)
    environments = (await service.bb("environment", "list", "--json")).json()["environments"]
    assert [e["id"] for e in environments] == [first.environment_id]


async def test_a_spawn_during_a_restart_is_taken_once_the_service_is_back(service):
    async with await Client.connect(service.data_dir) as client:
        await service.stop()
        spawned = asyncio.ensure_future(client.spawn("t1", provider="personal-workspace"))
        await service.start()
        await asyncio.wait_for(spawned, 60)
        assert (await client.wait_ready("t1", timeout=60)).status == "ready"


async def test_the_subscriber_example_rides_a_restart_out_quietly(service):
    async with running_example(service, "subscriber.py", "1") as subscriber:
        await service.stop()
        await asyncio.sleep(3)  # long enough for a reconnect to fail: nats-py tries every 2 s
        await service.start()

        async def spawn_until_heard() -> None:  # it hears them once it has reconnected, in its own time
            while True:
                await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--wait")

        spawning = asyncio.ensure_future(spawn_until_heard())
        try:
            heard = await line_with(subscriber, "ready: ")
        finally:
            spawning.cancel()
        listed = (await service.bb("environment", "list", "--json")).json()["environments"]
        assert heard.removeprefix("ready: ").strip() in [e["id"] for e in listed]
        assert await asyncio.wait_for(subscriber.wait(), 30) == 0  # it reads the audit consumer and ends
        assert subscriber.stderr is not None
        said = (await subscriber.stderr.read()).decode()
        assert "Traceback" not in said and said == "", said
