"""Replay speed: `bb events replay` against a raw scan + decode of the same log.

Builds a log of N events (default 100,000) by driving the domain application directly (no NATS):
environments spawned for threads, created, set up, some joined by a second thread, most archived,
torn down and removed, with a few dozen lifecycles in flight at once as a busy service writes them.
The log is kept under the temp dir and reused by later runs with the same N. Then, in the same run:

  (a) the baseline: every notification read page by page (`recorder.select_notifications`) and
      decoded into its domain event (`mapper.to_domain_event`), nothing else;
  (b) the replay as `bb events replay` runs it (`ReadModel.rebuild` over a `LogReader`, into a new
      read-models.sqlite in a temp dir), without the NATS round trip of the request.

Each is run `--rounds` times, alternating, and the best round of each counts: on a machine shared
with other work the best round is the one least disturbed. Gives events/s of both.

    python bench/replay.py [--events 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from common import Figure, table

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.projections.read_model import ReadModel

IN_FLIGHT = 48
PAGE = 500


def open_log(path: Path) -> Environments:
    return Environments(env=event_store_environment(f"sqlite:///{path}"), grace_for=lambda _: 0)


def lifecycle(app: Environments, n: int, rng: random.Random) -> Iterator[None]:
    """One environment's life, a step (one save) at a time."""
    thread_id = f"t{n}"
    path = f"/data/worktrees/{thread_id}/repo"
    environment = app.spawn_thread(
        thread_id,
        "/repos/project",
        None,
        "local",
        None,
        Placement(
            "git-worktree", "local", "/repos/project", {"branch": {"kind": "new", "name": f"b{n}"}}, thread_id, path
        ),
    )
    yield
    app.record_created(environment.id, 1, path, True, "main", None)
    yield
    app.start_setup(environment.id)
    yield
    succeeded = rng.random() > 0.05
    operation = app.environment(environment.id).setup_operation_id
    app.record_setup_outcome(environment.id, operation, succeeded, None if succeeded else "exit status 1")
    yield
    joined = succeeded and rng.random() < 0.3
    if joined:
        app.spawn_thread(f"{thread_id}-b", "/repos/project", None, "local", None, environment.id)
        yield
    if rng.random() < 0.25:
        return  # still in use when the log ends
    yield from retirement(
        app,
        environment.id,
        ([f"{thread_id}-b"] if joined else []) + [thread_id],
        lambda operation: app.record_teardown_outcome(environment.id, operation, "succeeded", None),
    )


def retirement(
    app: Environments, environment_id: UUID, thread_ids: list[str], record_teardown: Callable[[str], object]
) -> Iterator[None]:
    """The threads archived, then the environment's removal, its teardown's outcome recorded by
    `record_teardown(operation_id)`, a save at a time, until Removed."""
    for thread_id in thread_ids:
        app.archive_thread(thread_id, datetime.now(UTC))
        yield
    app.start_removal(environment_id, datetime.now(UTC))
    yield
    app.start_teardown(environment_id)
    yield
    operation = app.environment(environment_id).teardown_operation_id
    assert operation is not None
    record_teardown(operation)
    yield
    app.record_removed(environment_id, 1)


def write_log(
    path: Path,
    lifecycles: Callable[[Environments, random.Random], Iterable[Iterator[None]]],
    enough: Callable[[Environments], bool] = lambda app: False,
) -> None:
    """Run the lifecycles, IN_FLIGHT at a time with their steps interleaved as a busy service writes
    them, until they are all done or `enough`; written aside, then renamed, so a log is whole or absent."""
    building = path.with_name(path.name + ".building")
    for leftover in building.parent.glob(building.name + "*"):
        leftover.unlink()
    app = open_log(building)
    rng = random.Random(8)
    waiting = iter(lifecycles(app, rng))
    running: list[Iterator[None]] = []
    try:
        while not enough(app):
            running.extend(itertools.islice(waiting, IN_FLIGHT - len(running)))
            if not running:
                break
            for steps in rng.sample(running, len(running)):
                if next(steps, StopIteration) is StopIteration:
                    running.remove(steps)
    finally:
        app.close()
    os.replace(building, path)


def build_log(path: Path, events: int) -> None:
    """At least `events` events of git-worktree lifecycles."""
    write_log(
        path, lambda app, rng: (lifecycle(app, n, rng) for n in itertools.count()), lambda app: app.head() >= events
    )


def cached_log(events: int) -> Path:
    directory = Path(tempfile.gettempdir()) / "bb-bench-replay"
    directory.mkdir(exist_ok=True)
    path = directory / f"{events}-events.sqlite"
    if not path.exists():
        started = time.perf_counter()
        print(f"building a log of {events} events in {path} (reused by later runs)...", flush=True)
        build_log(path, events)
        print(f"  built in {time.perf_counter() - started:.1f} s", flush=True)
    return path


def scan_and_decode(app: Environments) -> int:
    decoded, position = 0, 0
    while notifications := app.recorder.select_notifications(start=position + 1, limit=PAGE):
        for notification in notifications:
            app.mapper.to_domain_event(notification)
        decoded += len(notifications)
        position = notifications[-1].id
    return decoded


async def replay(app: Environments, read_models: Path) -> int:
    read_model = await ReadModel.open(read_models)
    try:

        async def stream_position() -> int:
            return 0

        counts = await read_model.rebuild(LogReader(app).latest_views, stream_position)
    finally:
        await read_model.close()
    return counts.events


def timed(run: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    count = run()
    return count, time.perf_counter() - started


def measure(events: int, rounds: int) -> list[Figure]:
    log = cached_log(events)
    scratch = Path(tempfile.mkdtemp(prefix="bb-bench-replay-"))
    scans, replays = [], []
    try:
        for round_number in range(rounds):
            # Each on a cold application: no aggregate the other may have warmed.
            app = open_log(log)
            scans.append(timed(lambda: scan_and_decode(app)))
            app.close()
            app = open_log(log)
            read_models = scratch / f"read-models-{round_number}.sqlite"
            replays.append(timed(lambda: asyncio.run(replay(app, read_models))))
            app.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (scanned, scan_s), (replayed, replay_s) = min(scans, key=lambda r: r[1]), min(replays, key=lambda r: r[1])
    assert replayed == scanned, (replayed, scanned)
    rate = replayed / replay_s
    return [
        Figure(
            f"replay of a {scanned:,}-event log (best of {rounds})",
            rate,
            scanned / scan_s,
            "ev/s",
            "raw scan + decode of the same log",
            "≥ 50,000 ev/s",
            rate >= 50_000,
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    print(table(measure(arguments.events, arguments.rounds)))
