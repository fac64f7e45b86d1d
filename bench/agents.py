"""Work through host agents: spawn→ready through an agent in its own process vs the agent inside
`bb serve` vs a bare `git worktree add` + setup, and a burst of personal workspaces over two agents vs the same
burst on the agent in `bb serve`.

One real `bb serve`; hosts `a1` and `a2` registered, each with a `bb agent` of its own (its own
data dir and root). The routes alternate, N times each, on the same repository.

    python bench/agents.py [--runs 20] [--burst 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
from common import (
    ROOT,
    Figure,
    baseline_once,
    make_repository,
    percentile,
    service_environment,
    start_service,
    stop_service,
    table,
)

from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.wire.api_messages import RegisterHost, SpawnThread, ThreadRef


def start_agent(info: dict, host_id: str, credentials: str, base: Path) -> subprocess.Popen[bytes]:
    log = open(base.with_suffix(".log"), "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bb_environments.entrypoints.bb",
            "agent",
            "--host-id",
            host_id,
            "--credentials",
            credentials,
            "--nats-url",
            info["natsUrl"],
            "--root",
            str(base / "root"),
        ],
        env={**service_environment(base / "data"), "BB_LOG_LEVEL": "INFO"},
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )


async def serving(log: Path) -> None:
    while "is serving from" not in (log.read_text() if log.exists() else ""):
        await asyncio.sleep(0.05)


async def measure(runs: int, burst: int) -> list[Figure]:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-agents-"))
    agents: list[subprocess.Popen[bytes]] = []
    try:
        repo = make_repository(root)
        service, info = await start_service(root / "data")
        try:
            api = await ApiClient.connect(info["natsUrl"], nkeys_seed=info["credentials"]["operator"])
            for host_id in ("a1", "a2"):
                registered = await api.call("machines", "register", RegisterHost(host_id=host_id))
                agents.append(start_agent(info, host_id, registered["credentials"], root / host_id))
                await serving((root / host_id).with_suffix(".log"))
            listener = await nats.connect(info["natsUrl"], nkeys_seed=info["credentials"]["subscriber"])
            readiness: dict[str, asyncio.Future[None]] = {}

            async def on_ready(message) -> None:
                for thread_id in json.loads(message.data)["threadIds"]:
                    if thread_id in readiness and not readiness[thread_id].done():
                        readiness[thread_id].set_result(None)

            await listener.subscribe("bb.environments.*.ready", cb=on_ready)

            async def spawn(thread_id: str, host_id: str, provider: str = "git-worktree") -> float:
                started = time.perf_counter()
                readiness[thread_id] = asyncio.get_running_loop().create_future()
                await api.call(
                    "threads",
                    "spawn",
                    SpawnThread(
                        thread_id=thread_id,
                        environment_provider=provider,
                        host_id=host_id,
                        project_path=str(repo) if provider == "git-worktree" else None,
                    ),
                )
                await asyncio.wait_for(readiness[thread_id], 120)
                return time.perf_counter() - started

            for host_id in ("local", "a1"):
                await spawn(f"warmup-{host_id}", host_id)
            remote, here, bare = [], [], []
            for i in range(runs):
                remote.append(await spawn(f"remote{i}", "a1"))
                here.append(await spawn(f"here{i}", "local"))
                bare.append(baseline_once(repo, root / "bare" / str(i), f"bare/{i}"))
            for thread_id in [*(f"remote{i}" for i in range(runs)), *(f"here{i}" for i in range(runs))]:
                await api.call("threads", "archive", ThreadRef(thread_id=thread_id))

            started = time.perf_counter()
            await asyncio.gather(*(spawn(f"here-p{i}", "local", "personal-workspace") for i in range(burst)))
            burst_here_s = time.perf_counter() - started
            started = time.perf_counter()
            await asyncio.gather(*(spawn(f"p{i}", ("a1", "a2")[i % 2], "personal-workspace") for i in range(burst)))
            burst_s = time.perf_counter() - started
            await listener.close()
            await api.close()
        finally:
            for agent in agents:
                agent.send_signal(signal.SIGTERM)
                agent.wait()
            stop_service(service)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = []
    for name, fraction in (("p50", 0.5), ("p99", 0.99)):
        theirs = percentile(bare, fraction) * 1000
        figures.append(
            Figure(
                f"spawn→ready {name}, through an agent process ({runs} runs)",
                percentile(remote, fraction) * 1000,
                theirs,
                "ms",
                f"bare worktree add + setup {name}",
            )
        )
        figures.append(
            Figure(
                f"spawn→ready {name}, the agent in `bb serve` ({runs} runs)",
                percentile(here, fraction) * 1000,
                theirs,
                "ms",
                f"bare worktree add + setup {name}",
            )
        )
    figures.append(
        Figure(
            f"burst of {burst} personal workspaces through the API, over two agent processes",
            burst / burst_s,
            burst / burst_here_s,
            "env/s",
            "the same burst on the agent in `bb serve`",
        )
    )
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    arguments = parser.parse_args()
    print(table(asyncio.run(measure(arguments.runs, arguments.burst))))
