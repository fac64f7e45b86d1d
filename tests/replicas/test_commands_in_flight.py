"""SPEC 7.2 (v4), "a replica is never the user's problem": spawns in flight through the CLI and the
typed client when a replica is killed, and when one is stopped (SIGSTOP), all succeed, each thread
ready once, no environment made twice. One topology for both faults, one after the other."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from pathlib import Path

from bb_environments.bus.wire import subjects
from bb_environments.client import Client
from tests.integration.conftest import Result, eventually
from tests.replicas.test_replicas import HOST, Topology, ready_in_the_stream, stream_log, topology  # noqa: F401

IN_FLIGHT = 12  # of each client


async def spawns_through_a_fault(topology: Topology, fault, cli_dir: Path) -> None:
    """IN_FLIGHT spawns with the CLI and as many with the typed client, `fault()` done while they
    are under way; then each exited 0 (or returned ready), each thread ready once, on an
    environment of its own."""
    cli_environment = topology.environment("a") | {
        "BB_NATS_NKEY": str(topology.cluster.seed_file("operator")),
        "BB_DATA_DIR": str(cli_dir),
    }
    by_cli = [f"cli-{uuid.uuid4().hex[:12]}" for _ in range(IN_FLIGHT)]
    by_client = [f"typed-{uuid.uuid4().hex[:12]}" for _ in range(IN_FLIGHT)]
    client = await Client.connect(url=topology.cluster.urls, credentials=topology.cluster.seed_file("publisher"))
    service = await topology.service_connection()
    watcher = service.jetstream()
    try:

        async def cli(thread_id: str) -> Result:
            process = await asyncio.create_subprocess_exec(
                *topology.replica("b").cli(),
                "thread",
                "spawn",
                "--environment-provider",
                "personal-workspace",
                "--host",
                HOST,
                "--thread-id",
                thread_id,
                "--json",
                env=cli_environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(process.communicate(), 120)
            assert process.returncode is not None
            return Result(process.returncode, out.decode(), err.decode())

        async def typed(thread_id: str) -> str:
            await client.spawn(thread_id, provider="personal-workspace", host=HOST)
            return (await client.wait_ready(thread_id, timeout=120)).status

        before = (await watcher.stream_info(subjects.THREADS_STREAM)).state.last_seq
        spawning = asyncio.gather(*map(cli, by_cli), *map(typed, by_client))
        stored = 0

        async def under_way() -> None:
            nonlocal stored
            stored = (await watcher.stream_info(subjects.THREADS_STREAM)).state.last_seq - before

        while stored < 2:  # the typed client's first events are stored; the CLI's requests are going out
            await under_way()
            await asyncio.sleep(0.05)
        fault()
        results = await spawning
    finally:
        await client.close()
        await service.close()
    for thread_id, result in zip(by_cli, results[:IN_FLIGHT]):
        assert isinstance(result, Result) and result.returncode == 0, (thread_id, result)
    assert results[IN_FLIGHT:] == ["ready"] * IN_FLIGHT

    threads = by_cli + by_client
    environments = await ready_in_the_stream(topology, threads)
    assert len(set(environments)) == len(threads), "two threads on one environment"
    log = [document for _, document, _ in await stream_log(topology)]
    claimed = Counter(t for d in log if d.get("type") == "claimed" for t in d.get("threadIds", []))
    ready = Counter(d["environmentId"] for d in log if d.get("type") == "ready")
    assert all(claimed[t] == 1 for t in threads), f"a thread claimed an environment twice: {claimed}"
    assert all(ready[e] == 1 for e in environments), f"readiness not once each: {ready}"


async def test_spawns_in_flight_succeed_when_a_replica_is_killed_and_when_one_is_stopped(
    topology: Topology, tmp_path: Path
) -> None:
    await spawns_through_a_fault(topology, topology.replica("a").kill, tmp_path / "cli-1")

    await topology.start_replica("a")
    stopped = topology.replica("b")
    assert stopped.process is not None
    try:
        await spawns_through_a_fault(topology, lambda: stopped.process.send_signal(signal.SIGSTOP), tmp_path / "cli-2")
    finally:
        stopped.process.send_signal(signal.SIGCONT)
    await eventually(lambda: stopped.process.poll() is None, "the woken replica still running")
