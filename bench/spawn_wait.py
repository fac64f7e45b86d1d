"""`bb thread spawn --wait` against `bb thread spawn`, both as a user types them (the `bb` CLI).

The wait follows the environment's transcript and its settling event until it is ready; what it
adds over a spawn that returns once the environment is placed is the wait's own cost (a personal
workspace is ready within milliseconds of its placement). Alternating, N times each.

    python bench/spawn_wait.py [--runs 20]
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

from common import ROOT, Figure, percentile, service_environment, start_service, stop_service, table


def spawn_seconds(data_dir: Path, *extra: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bb_environments.entrypoints.bb",
            "thread",
            "spawn",
            "--environment-provider",
            "personal-workspace",
            "--json",
            *extra,
        ],
        env=service_environment(data_dir),
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - started


async def measure(runs: int) -> list[Figure]:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-"))
    try:
        service, _ = await start_service(root / "data")
        try:
            waited, placed = [], []
            for _ in range(runs):
                waited.append(spawn_seconds(root / "data", "--wait"))
                placed.append(spawn_seconds(root / "data"))
        finally:
            stop_service(service)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [
        Figure(
            f"`bb thread spawn --wait` {name}, personal workspace ({runs} runs)",
            percentile(waited, fraction) * 1000,
            percentile(placed, fraction) * 1000,
            "ms",
            f"`bb thread spawn` without --wait, {name}",
        )
        for name, fraction in (("p50", 0.5), ("p99", 0.99))
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    print(table(asyncio.run(measure(parser.parse_args().runs))))
