"""Soak: what the service keeps grows with the environments it has now, not with those it ever removed.

A real `bb serve` with a short retention (`--retention`, BB_REMOVED_RETENTION_S) runs `--cycles`
spawn→remove cycles of personal workspaces through thread events as the `publisher` role
(`created` + `message`, until `ready`; then `archived`, until `removed`), `--window` threads at a
time. After every 1,000 removed environments it waits until they are past retention and the sweep
has forgotten them, then prints, for those 1,000: the growth of the data dir (without the event
store, the read model and the nats-server's store, each shown apart), of the read model, of the
log stream (BB_ENVIRONMENTS: messages and bytes), of the nats-server's RSS, and the files in the
hooks directory; beside them the event store's own growth, which is the log itself and the
truth, kept on purpose. The first 1,000 include the start's own growth (caches, SQLite pages);
the goals are judged on the last. A running nats-server's RSS also holds what passes through it,
not what it keeps: the write cache of each stream's current block (up to 8 MiB a stream, freed
when the block is full), the duplicate maps (the id of every message published within
DUPLICATE_WINDOW_S, purged or not), and heap the Go runtime has not yet handed back. So after the
first 1,000 and after the last the bench also restarts `bb serve` (its nats-server with it, on the
same store) and samples once it serves again (its nats-server's least RSS over a quiet minute then:
what it needs to hold what it keeps); the last row is the growth between those two
restarts, per 1,000: what the environments removed in between left behind.

    python bench/soak.py [--cycles 5000] [--window 100] [--retention 2] [--deadline 900]

Bounded in count and in time: it stops after `--deadline` seconds, saying how far it got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import nats
from common import rss_mb, start_service, stop_service

from bb_environments.bus.access import SERVICE_INBOX_PREFIX
from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import ListEnvironments

PER = 1000
THREAD_EVENTS_KEPT_S = 60
MB = 1 << 20
GOALS = "data dir ≤ 0.1 MB, read model ≤ 0.1 MB, log stream 0 messages, nats-server RSS ≤ 1 MB, 0 hook files"
KEPT_APART = ("events.sqlite", "read-models.sqlite", "nats")


@dataclass(frozen=True)
class Sample:
    data_dir: int
    read_model: int
    event_store: int
    stream_messages: int
    stream_bytes: int
    nats_rss_mb: float
    hook_files: int


def bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def files_with(data_dir: Path, prefix: str) -> int:
    return sum(p.stat().st_size for p in data_dir.glob(f"{prefix}*") if p.is_file())


async def sample(data_dir: Path, info: dict, js) -> Sample:
    others = sum(
        bytes_under(p) if p.is_dir() else p.stat().st_size
        for p in data_dir.iterdir()
        if not p.name.startswith(KEPT_APART)
    )
    state = (await js.stream_info(subjects.ENVIRONMENTS_STREAM)).state
    hooks = data_dir / "hooks"
    return Sample(
        data_dir=others,
        read_model=files_with(data_dir, "read-models.sqlite"),
        event_store=files_with(data_dir, "events.sqlite"),
        stream_messages=state.messages,
        stream_bytes=state.bytes,
        nats_rss_mb=rss_mb(info["natsPid"]),
        hook_files=sum(1 for p in hooks.rglob("*") if p.is_file()) if hooks.exists() else 0,
    )


async def removed_still_listed(api: ApiClient) -> int:
    page = await api.call("environments", "list", ListEnvironments(status="removed", limit=1000))
    return len(page["environments"])


async def soak(cycles: int, window: int, retention_s: float, deadline_s: float) -> int:
    root = Path(tempfile.mkdtemp(prefix="bb-bench-soak-"))
    data_dir = root / "data"
    # Thread events are kept for their own age (BB_THREADS_MAX_AGE_S, 7 days by default), whatever
    # became of their environments: a minute here, so that what is measured is what removed
    # environments leave.
    settings = {
        "BB_REMOVED_RETENTION_S": str(retention_s),
        "BB_SWEEP_INTERVAL_S": "1",
        "BB_THREADS_MAX_AGE_S": str(THREAD_EVENTS_KEPT_S),
    }
    service, info = await start_service(data_dir, **settings)
    started = time.monotonic()

    async def reconnecting(error: Exception) -> None:
        """nats-py would print each refused attempt while the service restarts."""

    publisher = await nats.connect(info["natsUrl"], nkeys_seed=info["credentials"]["publisher"], error_cb=reconnecting)
    api = await ApiClient.connect(info["natsUrl"], nkeys_seed=info["credentials"]["operator"])
    try:
        js = publisher.jetstream()
        reached: dict[str, dict[str, asyncio.Future[None]]] = {"ready": {}, "removed": {}}
        environment_of: dict[str, str] = {}

        def waiter(kind: str, key: str) -> asyncio.Future[None]:
            return reached[kind].setdefault(key, asyncio.get_running_loop().create_future())

        def arrived(kind: str, key: str) -> None:
            if not (future := waiter(kind, key)).done():
                future.set_result(None)

        async def on_event(message) -> None:
            event = json.loads(message.data)
            if message.subject.endswith(".ready"):
                for thread_id in event["threadIds"]:
                    environment_of[thread_id] = event["environmentId"]
                    arrived("ready", thread_id)
            else:
                arrived("removed", event["environmentId"])

        await publisher.subscribe("bb.environments.*.ready", cb=on_event)
        await publisher.subscribe("bb.environments.*.removed", cb=on_event)
        intent = {
            "type": "provider",
            "environmentProviderId": "personal-workspace",
            "machine": {"type": "existing", "hostId": "local"},
            "inputs": {},
        }
        # The stream's figures are the service's to read: its own seed, as the tests' relay checks do.
        admin = await nats.connect(
            info["natsUrl"],
            nkeys_seed=str(data_dir / "credentials" / "service.nk"),
            error_cb=reconnecting,
            inbox_prefix=SERVICE_INBOX_PREFIX,
        )
        stream = admin.jetstream()
        previous = await sample(data_dir, info, stream)
        previous_done, done = 0, 0
        restarted_after_first: Sample | None = None

        async def restarted() -> Sample:
            """A sample of `bb serve` stopped and started again on its data dir, its nats-server
            keeping its port: the bench's other connections reconnect by themselves."""
            nonlocal service, api
            await api.close()
            stop_service(service)
            service, restarted_info = await start_service(data_dir, **settings)
            info["natsPid"] = restarted_info["natsPid"]
            api = await ApiClient.connect(info["natsUrl"], nkeys_seed=info["credentials"]["operator"])
            await publisher.flush(timeout=60)
            await admin.flush(timeout=60)
            await asyncio.sleep(5)  # the sweep's first passes, once it serves
            settled = await sample(data_dir, info, stream)
            # The blocks the restarted server read to recover stay cached a while, and Go hands
            # freed memory back to the system gradually: its least RSS over a quiet minute.
            least_rss = settled.nats_rss_mb
            for _ in range(12):
                await asyncio.sleep(5)
                least_rss = min(least_rss, rss_mb(info["natsPid"]))
            return replace(settled, nats_rss_mb=least_rss)

        print(
            f"soak: {cycles} spawn→remove cycles of personal workspaces, {window} at a time, "
            f"retention {retention_s} s; data under {root}",
            file=sys.stderr,
        )
        header = (
            "| removed | data dir | read model | log stream | nats-server RSS | hook files | event store |\n"
            "|---:|---:|---:|---:|---:|---:|---:|"
        )
        print(header)
        while done < cycles:
            if time.monotonic() - started > deadline_s:
                print(f"stopped at the deadline ({deadline_s:.0f} s) after {done} cycles", file=sys.stderr)
                break
            threads = [f"soak-{n}" for n in range(done, min(done + window, cycles))]
            for thread_id in threads:
                await js.publish(
                    subjects.thread_event(thread_id, "created"),
                    json.dumps({"type": "created", "threadId": thread_id, "environment": intent}).encode(),
                )
                await js.publish(
                    subjects.thread_event(thread_id, "message"),
                    json.dumps({"type": "message", "threadId": thread_id}).encode(),
                )
            await asyncio.wait_for(asyncio.gather(*(waiter("ready", t) for t in threads)), 300)
            for thread_id in threads:
                await js.publish(
                    subjects.thread_event(thread_id, "archived"),
                    json.dumps({"type": "archived", "threadId": thread_id}).encode(),
                )
            await asyncio.wait_for(asyncio.gather(*(waiter("removed", environment_of[t]) for t in threads)), 300)
            for thread_id in threads:  # what this bench itself would otherwise keep per cycle
                reached["removed"].pop(environment_of.pop(thread_id))
                reached["ready"].pop(thread_id)
            done += len(threads)
            if done % PER and done < cycles:
                continue
            # Past retention, and forgotten: the last removed may wait as the stream's last message.
            settle_deadline = time.monotonic() + retention_s + 120
            while await removed_still_listed(api) > 1:
                if time.monotonic() > settle_deadline:
                    raise TimeoutError("removed environments were still listed two minutes past retention")
                await asyncio.sleep(0.5)
            await asyncio.sleep(1)  # the host agent's pass over the hook records, on its own clock
            now = await sample(data_dir, info, stream)
            print(row(f"{done:,}", previous, now, PER / (done - previous_done)), flush=True)
            previous, previous_done = now, done
            if done == PER or (done >= cycles and restarted_after_first is not None):
                after_restart = await restarted()
                if restarted_after_first is None:
                    restarted_after_first = previous = after_restart
                else:
                    print(
                        row(
                            f"{PER:,} → {done:,}, each after a restart",
                            restarted_after_first,
                            after_restart,
                            PER / (done - PER),
                        ),
                        flush=True,
                    )
        await admin.close()
        print(
            f"goals per {PER:,} removed past retention: {GOALS}; {done} cycles in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        return 0
    finally:
        await api.close()
        await publisher.close()
        stop_service(service)
        shutil.rmtree(root, ignore_errors=True)


def row(removed: str, before: Sample, after: Sample, per: float) -> str:
    """One line: the growth over an interval, scaled to 1,000 removed environments."""

    def grown_mb(name: str) -> str:
        return f"{(getattr(after, name) - getattr(before, name)) * per / MB:+.3f} MB"

    messages = after.stream_messages - before.stream_messages
    return (
        f"| {removed} | {grown_mb('data_dir')} | {grown_mb('read_model')} | "
        f"{messages * per:+.0f} messages ({after.stream_messages} held, {after.stream_bytes / MB:.2f} MB) | "
        f"{(after.nats_rss_mb - before.nats_rss_mb) * per:+.2f} MB ({after.nats_rss_mb:.1f} MB) | "
        f"{after.hook_files} | {grown_mb('event_store')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=5000)
    parser.add_argument("--window", type=int, default=100, help="threads spawned and removed at a time")
    parser.add_argument("--retention", type=float, default=2.0, help="BB_REMOVED_RETENTION_S, in seconds")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds after which the soak stops")
    arguments = parser.parse_args()
    sys.exit(asyncio.run(soak(arguments.cycles, arguments.window, arguments.retention, arguments.deadline)))


if __name__ == "__main__":
    main()
