"""`bb environment list` while a setup hook prints 50 MB, against the same list with no hook running.

A real `bb serve` with a few ready environments; a git worktree is spawned whose setup prints
`--megabytes` of 50-byte lines, and `bb environment list --json` (the CLI, a subprocess) is timed
over and over while that setup runs, then as many times once it is done (idle). The ratio is what a
hook's output costs the API (SPEC 9: not noticeably).

    python bench/hook_output.py [--megabytes 50] [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, Figure, make_repository, percentile, service_environment, start_service, stop_service, table


def list_seconds(data_dir: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "bb_environments.entrypoints.bb", "environment", "list", "--json"],
        env=service_environment(data_dir),
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - started


def spawn(data_dir: Path, repo: Path, thread_id: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bb_environments.entrypoints.bb",
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(repo),
            "--thread-id",
            thread_id,
            "--json",
            *extra,
        ],
        env=service_environment(data_dir),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def measure(megabytes: int, runs: int) -> list[Figure]:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-hook-output-"))
    data_dir = root / "data"
    try:
        repo = make_repository(root)
        started = root / "printing"
        (repo / ".bb-env-setup.sh").write_text(
            f"touch {started}\nyes 0123456789012345678901234567890123456789012345678 | head -c {megabytes * 1_000_000}\n"
        )
        subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "-c",
                "user.name=b",
                "-c",
                "user.email=b@e",
                "commit",
                "--quiet",
                "-am",
                "a loud setup",
            ],
            check=True,
        )
        service, _ = await start_service(data_dir)
        try:
            for number in range(5):
                spawn(data_dir, repo, f"quiet-{number}", "--wait").wait()
            loud = spawn(data_dir, repo, "loud", "--wait")
            while not started.exists():
                await asyncio.sleep(0.01)
            busy = []
            while loud.poll() is None and len(busy) < runs:
                busy.append(list_seconds(data_dir))
            loud.wait()
            idle = [list_seconds(data_dir) for _ in range(max(len(busy), 1))]
        finally:
            stop_service(service)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [
        Figure(
            f"`bb environment list --json` while a setup prints {megabytes} MB, median of {len(busy)}",
            percentile(busy, 0.5) * 1000 if busy else float("nan"),
            percentile(idle, 0.5) * 1000,
            "ms",
            "the same list with no hook running, median",
            goal="not noticeably slower",
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=50)
    parser.add_argument("--runs", type=int, default=15)
    arguments = parser.parse_args()
    print(table(asyncio.run(measure(arguments.megabytes, arguments.runs))))
