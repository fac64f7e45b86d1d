"""Every bench in one run, one table: measure | ours | baseline (measured in the same run) | ratio | goal | met?

    python bench/all.py            # the issue's sizes (a first run also prepares the logs, kept in $TMPDIR)
    python bench/all.py --quick    # small sizes: checks that everything runs, in about a minute
    python bench/all.py --list-size 100000   # `bb environment list` with 100,000 environments too

The table is Markdown, ready for docs/benchmarks.md. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from dataclasses import dataclass

import replay
import scale
import spawn
import spawn_wait
import thread_events
from common import Figure, table


@dataclass(frozen=True)
class Sizes:
    spawn_runs: int
    burst: int
    personal: int
    replay_events: int
    replay_rounds: int
    environments: int
    list_size: int
    rounds: int


FULL = Sizes(
    spawn_runs=30,
    burst=20,
    personal=1000,
    replay_events=100_000,
    replay_rounds=3,
    environments=10_000,
    list_size=10_000,
    rounds=5,
)
QUICK = Sizes(
    spawn_runs=3, burst=3, personal=50, replay_events=2_000, replay_rounds=1, environments=100, list_size=200, rounds=2
)


def run_all(sizes: Sizes) -> list[Figure]:
    steps = [
        ("spawn through the API", lambda: asyncio.run(spawn.measure(sizes.spawn_runs))),
        ("spawn --wait", lambda: asyncio.run(spawn_wait.measure(sizes.spawn_runs))),
        ("thread events", lambda: asyncio.run(thread_events.measure(sizes.spawn_runs, sizes.burst, sizes.personal))),
        ("replay", lambda: replay.measure(sizes.replay_events, sizes.replay_rounds)),
        ("scale", lambda: asyncio.run(scale.measure(sizes.environments, [100, sizes.list_size], sizes.rounds))),
    ]
    figures: list[Figure] = []
    for name, step in steps:
        started = time.perf_counter()
        print(f"{name}...", file=sys.stderr, flush=True)
        figures += step()
        print(f"  {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check that it runs")
    parser.add_argument("--list-size", type=int, help=f"environments listed besides 100 (default {FULL.list_size:,})")
    arguments = parser.parse_args()
    sizes = QUICK if arguments.quick else FULL
    if arguments.list_size:
        sizes = Sizes(**{**sizes.__dict__, "list_size": arguments.list_size})
    started = time.perf_counter()
    figures = run_all(sizes)
    load = ", ".join(f"{average:.1f}" for average in os.getloadavg())
    print(table(figures))
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, load average at the end {load}, {time.perf_counter() - started:.0f} s in all"
    )
