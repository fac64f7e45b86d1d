"""Spawn-to-ready for git-worktree environments through the API, against a bare `git worktree add` + setup script.

Runs a real `bb serve` on a throwaway data dir and a small repository whose setup hook is trivial,
then alternates, N times each: our spawn (API request until the `ready` event arrives) and the
baseline `git worktree add -b … && bash .bb-env-setup.sh` on the same repository. Gives p50/p99 of
both. The CLI's own start-up (a Python process) is not part of "ours": it is the service that is
measured.

    python bench/spawn.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import nats
from common import Figure, baseline_once, make_repository, percentile, start_service, stop_service, table

from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.wire.api_messages import SpawnThread, ThreadRef


async def ours_once(api: ApiClient, readiness: dict[str, asyncio.Future], repo: Path, thread_id: str) -> float:
    started = time.perf_counter()
    waiter = asyncio.get_running_loop().create_future()
    readiness[thread_id] = waiter
    await api.call(
        "threads",
        "spawn",
        SpawnThread(thread_id=thread_id, environment_provider="git-worktree", project_path=str(repo)),
    )
    await asyncio.wait_for(waiter, 60)
    elapsed = time.perf_counter() - started
    await api.call("threads", "archive", ThreadRef(thread_id=thread_id))
    return elapsed


def latency_figures(route: str, ours: list[float], bare: list[float]) -> list[Figure]:
    """p50 and p99 of a spawn route against the bare baseline, with the issue's goals (1.25× / 1.5×)."""
    figures = []
    for name, fraction, goal in (("p50", 0.5, 1.25), ("p99", 0.99, 1.5)):
        mine, theirs = percentile(ours, fraction) * 1000, percentile(bare, fraction) * 1000
        figures.append(
            Figure(
                f"spawn→ready {name}, {route} ({len(ours)} runs)",
                mine,
                theirs,
                "ms",
                f"bare worktree add + setup {name}",
                f"≤ {goal}×",
                mine <= goal * theirs,
            )
        )
    return figures


async def measure(runs: int) -> list[Figure]:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-"))
    try:
        repo = make_repository(root)
        service, info = await start_service(root / "data")
        try:
            api = await ApiClient.connect(info["natsUrl"], nkeys_seed=info["credentials"]["operator"])
            listener = await nats.connect(info["natsUrl"], nkeys_seed=info["credentials"]["subscriber"])
            readiness: dict[str, asyncio.Future] = {}

            async def on_ready(message) -> None:
                for thread_id in json.loads(message.data)["threadIds"]:
                    if thread_id in readiness and not readiness[thread_id].done():
                        readiness[thread_id].set_result(None)

            await listener.subscribe("bb.environments.*.ready", cb=on_ready)
            await ours_once(api, readiness, repo, "warmup")
            ours, bare = [], []
            for i in range(runs):
                ours.append(await ours_once(api, readiness, repo, f"bench{i}"))
                bare.append(baseline_once(repo, root / "bare" / str(i), f"bare/{i}"))
            await listener.close()
            await api.close()
        finally:
            stop_service(service)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return latency_figures("API", ours, bare)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    print(table(asyncio.run(measure(parser.parse_args().runs))))
