"""Spawn-to-ready of a thread bound from a warm pool, against a bare `git worktree add` + setup script.

Runs a real `bb serve` on a throwaway data dir and a repository whose setup takes about a second
(it writes files, then sleeps 1 s), keeps a pool of it (`bb pool set --size 4`), then alternates, N
times each: a spawn through the API until its `ready` event (the pool refilled between runs, as
it does between threads) and the bare `git worktree add -b … && bash .bb-env-setup.sh` on the
same repository. Also gives the CPU the service's process tree spent while the full pool sat idle
(the refill's own cost: a plan of the base's head every second) and per member it prepared. Ends
with one line: `pool: p50 A ms p99 B ms; bare cold p50 C ms p99 D ms; ratio p50 R`.

    python bench/pool.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import nats
from common import Figure, Readiness, baseline_once, percentile, start_service, stop_service, table, tree_cpu_seconds

from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.wire.api_messages import Nothing, SetPool, SpawnThread, ThreadRef

POOL_SIZE = 4
IDLE_WINDOW_S = 10.0
SETUP = "for i in $(seq 1 50); do echo $i > generated-$i.txt; done\nsleep 1\n"


def slow_setup_repository(root: Path) -> Path:
    repo = root / "repo"
    subprocess.run(["git", "init", "--quiet", "--initial-branch=main", str(repo)], check=True)
    for i in range(20):
        (repo / f"file{i}.txt").write_text(f"content {i}\n" * 50)
    (repo / ".bb-env-setup.sh").write_text(SETUP)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@e", "commit", "--quiet", "-m", "x"],
        check=True,
    )
    return repo


async def ready_members(api: ApiClient) -> int:
    pools = (await api.call("pools", "list", Nothing()))["pools"]
    return pools[0]["members"]["ready"] if pools else 0


async def until_members(api: ApiClient, wanted: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while await ready_members(api) < wanted:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pool did not reach {wanted} ready members in {timeout} s")
        await asyncio.sleep(0.05)


async def pooled_once(api: ApiClient, readiness: Readiness, repo: Path, thread_id: str) -> float:
    started = time.perf_counter()
    await api.call(
        "threads",
        "spawn",
        SpawnThread(thread_id=thread_id, environment_provider="git-worktree", project_path=str(repo)),
    )
    await readiness.until([thread_id], timeout=120)
    elapsed = readiness.at[thread_id] - started
    await api.call("threads", "archive", ThreadRef(thread_id=thread_id))
    return elapsed


async def measure(runs: int) -> tuple[list[Figure], str]:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-pool-"))
    try:
        repo = slow_setup_repository(root)
        service, info = await start_service(root / "data")
        try:
            api = await ApiClient.connect(info["natsUrl"], nkeys_seed=info["credentials"]["operator"])
            listener = await nats.connect(info["natsUrl"], nkeys_seed=info["credentials"]["subscriber"])
            readiness = Readiness()
            await readiness.subscribe(listener)
            bound: set[str] = set()

            async def on_bound(message) -> None:
                bound.update(json.loads(message.data)["threadIds"])

            await listener.subscribe("bb.environments.*.bound", cb=on_bound)
            filled_at = time.perf_counter()
            cpu_before = tree_cpu_seconds([service.pid])
            await api.call("pools", "set", SetPool(project_path=str(repo), provider_id="git-worktree", size=POOL_SIZE))
            await until_members(api, POOL_SIZE)
            fill_s = time.perf_counter() - filled_at
            fill_cpu = tree_cpu_seconds([service.pid]) - cpu_before
            # The pool full and no thread: what the refill alone costs.
            await asyncio.sleep(1)
            idle_before = tree_cpu_seconds([service.pid])
            await asyncio.sleep(IDLE_WINDOW_S)
            idle_cpu = tree_cpu_seconds([service.pid]) - idle_before
            pooled, bare = [], []
            for i in range(runs):
                await until_members(api, 1)  # as a thread arriving after the refill finds it
                pooled.append(await pooled_once(api, readiness, repo, f"pooled{i}"))
                bare.append(baseline_once(repo, root / "bare" / str(i), f"bare/{i}"))
            await listener.close()
            await api.close()
        finally:
            stop_service(service)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p50, p99 = percentile(pooled, 0.5) * 1000, percentile(pooled, 0.99) * 1000
    bare50, bare99 = percentile(bare, 0.5) * 1000, percentile(bare, 0.99) * 1000
    figures = [
        Figure(
            f"spawn→ready p50, bound from a pool ({runs} runs, {len(bound)} bound)",
            p50,
            bare50,
            "ms",
            "bare worktree add + 1 s setup p50",
            "≤ 0.1×",
            p50 <= 0.1 * bare50,
        ),
        Figure(
            f"spawn→ready p99, bound from a pool ({runs} runs)", p99, bare99, "ms", "bare worktree add + 1 s setup p99"
        ),
        Figure(f"filling the pool: {POOL_SIZE} members created and set up", fill_s, None, "s"),
        Figure("CPU of filling the pool, per member (service tree, setups included)", fill_cpu / POOL_SIZE, None, "s"),
        Figure(
            f"CPU of the refill with the pool full and idle ({IDLE_WINDOW_S:.0f} s)",
            100 * idle_cpu / IDLE_WINDOW_S,
            None,
            "% of a core",
        ),
    ]
    line = (
        f"pool: p50 {p50:.0f} ms p99 {p99:.0f} ms; bare cold p50 {bare50:.0f} ms p99 {bare99:.0f} ms; "
        f"ratio p50 {p50 / bare50:.3f}"
    )
    return figures, line


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    figures, line = asyncio.run(measure(parser.parse_args().runs))
    print(table(figures))
    print(line)
