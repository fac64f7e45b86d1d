"""Thread events on NATS to ready, against a bare `git worktree add` + setup script.

The route an agent platform takes: as the `publisher` role, publish `created` (a git-worktree
intent) and a first `message` on `bb.threads.<T>.…`, then wait for `bb.environments.<id>.ready`
naming the thread. Two measurements, each beside the bare baseline measured in the same run:

- one thread at a time, N runs: p50/p99 of publish → ready, against one bare worktree add + setup;
- a burst: `--burst` threads published at once, time until the last is ready, against the same
  number of bare worktree adds + setups run one after another;
- a personal-workspace burst: `--personal` threads (`created` + `message` each) published with a
  window of unacknowledged publishes, environments/s and thread events/s until the last is ready,
  against the same messages published the same way into a plain nats-server (a stream on
  `bb.threads.>`, no service behind it).

A count of 0 leaves that measurement out (runs of 0: the single-thread one).

    python bench/thread_events.py [--runs 20] [--burst 20] [--personal 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import nats
from common import Figure, Readiness, baseline_once, cpu_seconds, make_repository, start_service, stop_service, table
from nats.js import api
from spawn import latency_figures

from bb_environments.bus.embedded_server import nats_server_binary


async def publish_thread(js, repo: Path, thread_id: str) -> None:
    intent = {"type": "provider", "environmentProviderId": "git-worktree"}
    for kind, extra in (("created", {"projectPath": str(repo), "environment": intent}), ("message", {})):
        body = {"type": kind, "threadId": thread_id, **extra}
        await js.publish(f"bb.threads.{thread_id}.{kind}", json.dumps(body).encode())


PUBLISH_WINDOW = 256


def personal_thread_events(thread_ids: list[str], hosts: tuple[str, ...] = ()) -> list[tuple[str, bytes]]:
    """`created` (a personal-workspace intent) and `message` of each thread, all the `created` first;
    the threads spread over `hosts` in turn (none: the service's own host)."""
    intent = {"type": "provider", "environmentProviderId": "personal-workspace"}
    created = [
        (
            f"bb.threads.{t}.created",
            json.dumps(
                {
                    "type": "created",
                    "threadId": t,
                    "environment": intent,
                    **({"hostId": hosts[n % len(hosts)]} if hosts else {}),
                }
            ),
        )
        for n, t in enumerate(thread_ids)
    ]
    messages = [(f"bb.threads.{t}.message", json.dumps({"type": "message", "threadId": t})) for t in thread_ids]
    return [(subject, body.encode()) for subject, body in created + messages]


async def windowed_publish(js, messages: list[tuple[str, bytes]]) -> None:
    """Publish with up to PUBLISH_WINDOW acknowledgements outstanding, until all are acknowledged."""
    for subject, body in messages:
        await js.publish_async(subject, body)
    await js.publish_async_completed()


async def _quiet(error: Exception) -> None:
    pass


async def raw_publish_seconds(root: Path, messages: list[tuple[str, bytes]]) -> float:
    """The same messages into a plain nats-server with a file stream on `bb.threads.>`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(root / "raw")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        nc = await nats.connect(
            f"nats://127.0.0.1:{port}", max_reconnect_attempts=-1, reconnect_time_wait=0.05, error_cb=_quiet
        )  # refused until the server listens
        js = nc.jetstream(publish_async_max_pending=PUBLISH_WINDOW)
        await js.add_stream(api.StreamConfig(name="RAW", subjects=["bb.threads.>"], storage=api.StorageType.FILE))
        started = time.perf_counter()
        await windowed_publish(js, messages)
        elapsed = time.perf_counter() - started
        await nc.close()
        return elapsed
    finally:
        server.terminate()
        server.wait()


async def measure(runs: int, burst: int, personal: int) -> list[Figure]:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-"))
    figures: list[Figure] = []
    try:
        repo = make_repository(root)
        service, info = await start_service(root / "data")
        try:
            publisher = await nats.connect(info["natsUrl"], nkeys_seed=info["credentials"]["publisher"])
            js = publisher.jetstream()
            readiness = Readiness()
            await readiness.subscribe(publisher)

            async def one(thread_id: str) -> float:
                started = time.perf_counter()
                await publish_thread(js, repo, thread_id)
                await readiness.until([thread_id])
                return readiness.at[thread_id] - started

            await one("warmup")
            if personal:
                personal_ids = [f"personal{i}" for i in range(personal)]
                personal_events = personal_thread_events(personal_ids)
                windowed = publisher.jetstream(publish_async_max_pending=PUBLISH_WINDOW)
                cpu_before = cpu_seconds([service.pid])
                started = time.perf_counter()
                await windowed_publish(windowed, personal_events)
                await readiness.until(personal_ids)
                personal_seconds = max(readiness.at[t] for t in personal_ids) - started
                cpu_ms_per_environment = (cpu_seconds([service.pid]) - cpu_before) * 1000 / personal
                raw_seconds = await raw_publish_seconds(root, personal_events)
                events = len(personal_events)
                environments_per_s = personal / personal_seconds
                figures += [
                    Figure(
                        f"burst of {personal} personal-workspace threads as thread events: environments/s",
                        environments_per_s,
                        None,
                        "env/s",
                        goal="≥ 300",
                        met=environments_per_s >= 300,
                    ),
                    Figure(
                        "same burst: thread events/s until the last is ready",
                        events / personal_seconds,
                        events / raw_seconds,
                        "ev/s",
                        f"windowed js.publish ({PUBLISH_WINDOW}) into a plain nats-server",
                    ),
                    # Less noisy than the rates above on a shared machine: what `bb serve` itself spent.
                    Figure("same burst: `bb serve` CPU per environment", cpu_ms_per_environment, None, "ms"),
                ]
            if runs:
                ours, bare = [], []
                for i in range(runs):
                    ours.append(await one(f"single{i}"))
                    bare.append(baseline_once(repo, root / "bare" / f"s{i}", f"bare/s{i}"))
                figures += latency_figures("thread events", ours, bare)
            if burst:
                burst_ids = [f"burst{i}" for i in range(burst)]
                started = time.perf_counter()
                await asyncio.gather(*(publish_thread(js, repo, t) for t in burst_ids))
                await readiness.until(burst_ids)
                last_ready = max(readiness.at[t] for t in burst_ids) - started
                bare_started = time.perf_counter()
                for i in range(burst):
                    baseline_once(repo, root / "bare" / f"b{i}", f"bare/b{i}")
                bare_burst = time.perf_counter() - bare_started
                figures.append(
                    Figure(
                        f"burst of {burst} git-worktree threads as thread events: last ready",
                        last_ready * 1000,
                        bare_burst * 1000,
                        "ms",
                        f"{burst} bare worktree adds + setups one after another",
                    )
                )
            await publisher.close()
        finally:
            stop_service(service)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--personal", type=int, default=1000)
    arguments = parser.parse_args()
    print(table(asyncio.run(measure(arguments.runs, arguments.burst, arguments.personal))))
