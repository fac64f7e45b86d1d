"""Spawn-to-ready for git-worktree environments, against a bare `git worktree add` + setup script.

Runs a real `bb serve` on a throwaway data dir and a small repository whose setup hook is trivial,
then alternates, N times each: our spawn (API request until the `ready` event arrives) and the
baseline `git worktree add -b … && sh .bb-env-setup.sh` on the same repository. Prints p50/p99 of
both and their ratios. The CLI's own start-up (a Python process) is not part of "ours": it is the
service that is measured.

    python bench/spawn.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bb_environments.bus.api_messages import SpawnThread, ThreadRef  # noqa: E402
from bb_environments.bus.client import ApiClient  # noqa: E402


def make_repository(root: Path) -> Path:
    repo = root / "repo"
    subprocess.run(["git", "init", "--quiet", "--initial-branch=main", str(repo)], check=True)
    for i in range(20):
        (repo / f"file{i}.txt").write_text(f"content {i}\n" * 50)
    (repo / ".bb-env-setup.sh").write_text("echo ready > .setup-done\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@e", "commit", "--quiet", "-m", "x"],
                   check=True)
    return repo


def baseline_once(repo: Path, target: Path, branch: str) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-c", f'git -C "{repo}" worktree add --quiet -b "{branch}" "{target}" && '
                                  f'cd "{target}" && sh .bb-env-setup.sh'], check=True)
    return time.perf_counter() - started


async def ours_once(api: ApiClient, readiness: dict[str, asyncio.Future], repo: Path, thread_id: str) -> float:
    started = time.perf_counter()
    waiter = asyncio.get_running_loop().create_future()
    readiness[thread_id] = waiter
    await api.call("threads", "spawn", SpawnThread(thread_id=thread_id, environment_provider="git-worktree",
                                                   project_path=str(repo)))
    await asyncio.wait_for(waiter, 60)
    elapsed = time.perf_counter() - started
    await api.call("threads", "archive", ThreadRef(thread_id=thread_id))
    return elapsed


async def start_service(root: Path) -> tuple[subprocess.Popen[bytes], dict]:
    """`bb serve` on a data dir under `root`; its server.json once it serves."""
    environment = {**os.environ, "BB_DATA_DIR": str(root / "data"), "BB_RETIRE_GRACE_MS": "0", "BB_LOG_LEVEL": "WARNING"}
    service = subprocess.Popen([sys.executable, "-m", "bb_environments.entrypoints.cli", "serve"], env=environment,
                               cwd=Path(__file__).resolve().parents[1], stderr=subprocess.DEVNULL)
    server_file = root / "data" / "server.json"
    while not server_file.exists():
        await asyncio.sleep(0.05)
    return service, json.loads(server_file.read_text())


def stop_service(service: subprocess.Popen[bytes], root: Path) -> None:
    service.terminate()
    service.wait()
    shutil.rmtree(root, ignore_errors=True)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def main(runs: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-"))
    repo = make_repository(root)
    service, info = await start_service(root)
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
        stop_service(service, root)

    p50_ours, p99_ours = percentile(ours, 0.5) * 1000, percentile(ours, 0.99) * 1000
    p50_bare, p99_bare = percentile(bare, 0.5) * 1000, percentile(bare, 0.99) * 1000
    print(f"runs: {runs}")
    print(f"bare git worktree add + setup: p50 {p50_bare:7.1f} ms  p99 {p99_bare:7.1f} ms")
    print(f"bb spawn -> ready:             p50 {p50_ours:7.1f} ms  p99 {p99_ours:7.1f} ms  (mean {statistics.mean(ours)*1000:.1f})")
    print(f"ratio: p50 {p50_ours / p50_bare:.2f}x (goal <= 1.25x)  p99 {p99_ours / p99_bare:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))
