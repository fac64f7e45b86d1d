"""A nemesis (SPEC 5 and 7): thread events flow into the replicated topology of real processes
(PostgreSQL, a 3-node NATS cluster, two `bb serve --no-agent` replicas, the agents of hosts h1 and
h2) while a scheduler kills, pauses and restarts its parts at random; then everything runs again
and what SPEC 5 and 7 promise is checked against the log, the streams and the disks.

The faults come from a seed, printed with the schedule: DEFAULT_SEED unless BB_NEMESIS_SEED names
another (a number replays that run; `random` draws one), so that the suite's run is the same each
time. Never two faults that would lose a quorum at once: at most one replica, one NATS node, one
agent and PostgreSQL down at a time. After each fault the time until the next thread placed is
ready is printed.

    BB_NEMESIS_SEED=random python -m pytest -n 0 -s tests/replicas -k nemesis

BB_NEMESIS_SECONDS (of faults, default 150), BB_NEMESIS_RATE (threads per second, default 2) and
BB_NEMESIS_PAUSE_REPLICAS=0 (no SIGSTOP of a replica) change the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest

from bb_environments.bus.access import SERVICE_INBOX_PREFIX
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.thread_events import (
    Machine,
    ProviderIntent,
    ThreadArchivedMessage,
    ThreadCreatedMessage,
    ThreadMessageMessage,
)
from scripts.engines import NODES
from scripts.topology import POSTGRES, Topology
from tests.integration.conftest import stored_messages, write_hooks
from tests.replicas.conftest import publish_stored

REPLICAS = ("r1", "r2")
HOSTS = ("h1", "h2")
FAULTS_S = float(os.environ.get("BB_NEMESIS_SECONDS", "150"))
THREADS_PER_S = float(os.environ.get("BB_NEMESIS_RATE", "2"))
PAUSE_REPLICAS = os.environ.get("BB_NEMESIS_PAUSE_REPLICAS", "1") != "0"
DEFAULT_SEED = 6
"""The suite's schedule: every kind of part, nodes paused and killed, both replicas paused and one
killed, an agent killed, PostgreSQL killed and restarted; on the code before it, spawns 35-47 s
late after a node's pause and the agent's traceback on a cancel the core's log could not answer."""
MAX_FAULTS = 18
BETWEEN_FAULTS_S = (5.0, 11.0)
RECOVERY_S = 10.0
"""Planned room after a part is back before its kind is hit again: a node catching up, a replica taking leases."""
ARCHIVED_SHARE = 1 / 3
ARCHIVE_AFTER_S = (0.5, 20.0)
SETTLE_S = 120.0
PUBLISH_S = 60.0
CLOSE_S = 10.0

Menu = dict[str, list[tuple[str, str, tuple[float, float]]]]
"""By kind of part (one of each kind down at a time): (part, action, range of seconds down)."""


def fault_menu() -> Menu:
    return {
        "replica": [(r, "kill", (1.0, 8.0)) for r in REPLICAS]
        + ([(r, "pause", (3.0, 15.0)) for r in REPLICAS] if PAUSE_REPLICAS else []),
        "nats": [(n, action, (1.0, 10.0)) for n in NODES for action in ("kill", "pause")],
        "agent": [(h, action, (1.0, 10.0)) for h in HOSTS for action in ("kill", "pause")],
        "postgres": [(POSTGRES, "restart", (0.0, 0.0)), (POSTGRES, "kill", (1.0, 6.0))],
    }


@dataclass
class Fault:
    at: float
    """Seconds after the faults begin."""
    kind: str
    part: str
    action: str
    """`kill` (then started again), `pause` (SIGSTOP, then SIGCONT) or `restart` (PostgreSQL's fast restart)."""
    down_s: float
    began: float | None = None
    """When it was done (wall clock)."""
    back_after_s: float | None = None
    """Seconds from then until the part was back."""

    def __str__(self) -> str:
        down = f" for {self.down_s:.1f} s" if self.action != "restart" else ""
        return f"t+{self.at:5.1f} s  {self.action} {self.part}{down}"


def plan_faults(rng: random.Random, menu: Menu) -> list[Fault]:
    """The schedule: a fault every few seconds, of a kind none of which is down (or just back) then."""
    plan: list[Fault] = []
    free_at = dict.fromkeys(menu, 0.0)
    at = rng.uniform(*BETWEEN_FAULTS_S) / 2
    while at < FAULTS_S - 5 and len(plan) < MAX_FAULTS:
        if kinds := [kind for kind, since in free_at.items() if since <= at]:
            kind = rng.choice(kinds)
            part, action, (low, high) = rng.choice(menu[kind])
            down_s = round(rng.uniform(low, high), 1)
            plan.append(Fault(round(at, 1), kind, part, action, down_s))
            free_at[kind] = at + down_s + RECOVERY_S
        at += rng.uniform(*BETWEEN_FAULTS_S)
    return plan


class Nemesis:
    """Carries out a schedule on a topology, and notes what came back only with help."""

    def __init__(self, topology: Topology, plan: list[Fault]) -> None:
        self.topology = topology
        self.plan = plan
        self.violations: list[str] = []
        self._kinds = {fault.kind: asyncio.Lock() for fault in plan}
        self._down: set[str] = set()

    async def run(self, began: float) -> None:
        """Each fault at its time, healed after its time down; skipped while a part of its kind is
        still down (not yet back from an earlier fault): never two of a kind at once."""
        faults = []
        for fault in self.plan:
            await asyncio.sleep(max(0.0, began + fault.at - time.monotonic()))
            if self._kinds[fault.kind].locked():
                say(f"{clock(time.time())} {fault}: skipped, a part of its kind is not back yet")
                continue
            await self._kinds[fault.kind].acquire()
            faults.append(asyncio.create_task(self._inflict(fault)))
        await asyncio.gather(*faults)

    async def watch(self) -> None:
        """Until cancelled: a replica or an agent that exits by itself is a violation; it is started again."""
        while True:
            for part, status in self.topology.exited().items():
                if part not in self._down:
                    self.violations.append(
                        f"{part} exited by itself with status {status}; its log ends:\n"
                        f"{log_end(self.topology.log(part))}"
                    )
                    await self._bring_back(part, self.topology.start_again)
            await asyncio.sleep(1)

    async def _inflict(self, fault: Fault) -> None:
        self._down.add(fault.part)
        try:
            fault.began = time.time()
            if fault.action == "restart":
                await asyncio.to_thread(self.topology.postgres.restart)  # type: ignore[union-attr]
                say(f"{clock(fault.began)} {fault}: done")
            else:
                await asyncio.to_thread(getattr(self.topology, fault.action), fault.part)
                say(f"{clock(fault.began)} {fault}")
                await asyncio.sleep(fault.down_s)
                heal = self.topology.start_again if fault.action == "kill" else self.topology.resume
                await self._bring_back(fault.part, heal)
            fault.back_after_s = time.time() - fault.began
        finally:
            self._down.discard(fault.part)
            self._kinds[fault.kind].release()

    async def _bring_back(self, part: str, heal: Callable[[str], None]) -> None:
        """Heal `part`; what did not come back at once is a violation, and is helped once more."""
        self._down.add(part)
        try:
            for attempt in range(2):
                try:
                    await asyncio.to_thread(heal, part)
                    say(f"{clock(time.time())} {part} back")
                    return
                except (RuntimeError, TimeoutError, AssertionError, subprocess.CalledProcessError) as failed:
                    self.violations.append(f"{part} did not come back (attempt {attempt + 1}): {failed}")
                    heal = self._helped_up
        finally:
            self._down.discard(part)

    def _helped_up(self, part: str) -> None:
        """A part that did not come back: started again if its process ended, else waited for."""
        if part in NODES:
            assert self.topology.cluster is not None
            self.topology.cluster.wait_healthy()
        elif part in self.topology.exited() or part == POSTGRES:
            self.topology.start_again(part)


@dataclass
class Thread:
    id: str
    host: str
    archive_after_s: float | None
    placed_at: float = 0.0
    """When its `created` was first sent (wall clock)."""


class Workload:
    """Threads on a git worktree of their host's repository, published as a publishing service does;
    a share of them archived a little later."""

    def __init__(self, topology: Topology, repos: dict[str, Path], rng: random.Random) -> None:
        self.topology = topology
        self.repos = repos
        self.rng = rng
        self.threads: dict[str, Thread] = {}
        self.violations: list[str] = []

    async def run(self, until: float) -> None:
        publisher = await connect(self.topology, "publisher")
        try:
            js, lives, began = publisher.jetstream(), [], time.monotonic()
            while time.monotonic() < until:
                number = len(self.threads)
                thread = Thread(
                    f"nemesis-{number:04d}",
                    HOSTS[number % len(HOSTS)],
                    self.rng.uniform(*ARCHIVE_AFTER_S) if self.rng.random() < ARCHIVED_SHARE else None,
                )
                self.threads[thread.id] = thread
                lives.append(asyncio.create_task(self._life(js, thread)))
                await asyncio.sleep(max(0.0, began + (number + 1) / THREADS_PER_S - time.monotonic()))
            await asyncio.gather(*lives)
        finally:
            await closed(publisher)

    async def _life(self, js: Any, thread: Thread) -> None:
        thread.placed_at = time.time()
        intent = ProviderIntent(environment_provider_id="git-worktree", machine=Machine(host_id=thread.host))
        try:
            await publish_stored(
                js,
                ThreadCreatedMessage(
                    thread_id=thread.id, project_path=str(self.repos[thread.host]), environment=intent
                ),
                PUBLISH_S,
            )
            await publish_stored(js, ThreadMessageMessage(thread_id=thread.id, text="go"), PUBLISH_S)
            if thread.archive_after_s is not None:
                await asyncio.sleep(thread.archive_after_s)
                await publish_stored(js, ThreadArchivedMessage(thread_id=thread.id), PUBLISH_S)
        except AssertionError as lost:
            self.violations.append(str(lost))


def say(line: str) -> None:
    print(line, flush=True)


def clock(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]


def log_end(path: Path, characters: int = 2000) -> str:
    return path.read_text(errors="replace")[-characters:] if path.exists() else "(no log)"


async def connect(topology: Topology, role: str) -> nats.aio.client.Client:
    """A connection as `role` that rides out every fault: it reconnects for good, quietly."""

    async def quiet(error: Exception) -> None:
        pass

    options: dict[str, Any] = {"inbox_prefix": SERVICE_INBOX_PREFIX} if role == "service" else {}
    return await nats.connect(
        topology.nats_urls.split(","),
        nkeys_seed=str(topology.seed_file(role)),
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=quiet,
        **options,
    )


async def closed(nc: nats.aio.client.Client) -> None:
    """Close a connection of the test's own, given up on after CLOSE_S: nats-py's close waits for
    its socket to drain, which a node frozen at that moment does not let happen (nats.py#671)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(nc.close(), CLOSE_S)


def bb(topology: Topology, *arguments: str, **environment: str) -> subprocess.CompletedProcess[str]:
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("BB_")}
    return subprocess.run(
        [sys.executable, "-m", "bb_environments.entrypoints.bb", *arguments],
        text=True,
        capture_output=True,
        timeout=120,
        env={**inherited, **environment},
    )


def exported_log(topology: Topology) -> list[dict[str, Any]] | str:
    """The whole log, read from PostgreSQL by `bb events export` (on a data dir no replica serves),
    or what the export said when it failed."""
    exported = bb(
        topology, "events", "export", BB_DATA_DIR=str(topology.base / "reader"), BB_EVENT_STORE=topology.event_store
    )
    if exported.returncode != 0:
        return f"bb events export exited {exported.returncode}: {exported.stderr.strip()}"
    return [json.loads(line) for line in exported.stdout.splitlines()]


def environment_events(log: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each environment's own events, in log order."""
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in log:
        if "threadIds" in event and "environmentId" in event:
            events[event["environmentId"]].append(event)
    return events


def environments_of_threads(environments: dict[str, list[dict[str, Any]]]) -> dict[str, set[str]]:
    held: dict[str, set[str]] = defaultdict(set)
    for environment_id, events in environments.items():
        for event in events:
            for thread_id in event["threadIds"]:
                held[thread_id].add(environment_id)
    return held


def unsettled(threads: dict[str, Thread], log: list[dict[str, Any]]) -> list[str]:
    """Each thread whose environment is not (or not only) in the state the thread asks for."""
    environments = environment_events(log)
    held = environments_of_threads(environments)
    wrong = []
    for thread in threads.values():
        wanted = "removed" if thread.archive_after_s is not None else "ready"
        last = {e: environments[e][-1] for e in held.get(thread.id, set())}
        if [event["status"] for event in last.values()] != [wanted]:
            seen = {e: f"{event['status']} ({event['statusMessage']})" for e, event in last.items()}
            wrong.append(f"{thread.id} wants {wanted}: {seen or 'no environment'}")
    return wrong


async def settle(topology: Topology, threads: dict[str, Thread]) -> list[dict[str, Any]]:
    """The log once every thread's environment is where it should be, or at the deadline."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        log = await asyncio.to_thread(exported_log, topology)
        if isinstance(log, str):
            assert time.monotonic() < deadline, log
        elif not (wrong := unsettled(threads, log)) or time.monotonic() > deadline:
            say(f"{clock(time.time())} settled: {len(threads) - len(wrong)} of {len(threads)} threads")
            return log
        await asyncio.sleep(3)


def listed_environments(topology: Topology) -> dict[str, dict[str, Any]]:
    listed = bb(topology, "environment", "list", "--all", "--json", **topology.cli_environment())
    assert listed.returncode == 0, listed.stderr
    return {document["id"]: document for document in json.loads(listed.stdout)["environments"]}


async def read_model(topology: Topology, log: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The environments as `bb environment list --all` shows them, once each is in its state in the
    log (the replica that answers may be a moment behind), or at the deadline."""
    deadline = time.monotonic() + SETTLE_S / 4
    in_log = {environment_id: events[-1]["status"] for environment_id, events in environment_events(log).items()}
    while True:
        documents = await asyncio.to_thread(listed_environments, topology)
        listed = {environment_id: document["status"] for environment_id, document in documents.items()}
        if listed == in_log or time.monotonic() > deadline:
            return documents
        await asyncio.sleep(2)


def check_environments(threads: dict[str, Thread], log: list[dict[str, Any]]) -> Iterator[str]:
    """Every thread on one environment, in the state it asks for; versions gap-free; each `ready` once in the log."""
    yield from (f"not settled: {wrong}" for wrong in unsettled(threads, log))
    environments = environment_events(log)
    for environment_id, events in environments.items():
        versions = [event["version"] for event in events]
        if versions != list(range(1, len(versions) + 1)):
            yield f"environment {environment_id}: versions {versions} in the log"
        if (ready := sum(event["type"] == "ready" for event in events)) > 1:
            yield f"environment {environment_id}: ready {ready} times in the log"


def check_claims(log: list[dict[str, Any]]) -> Iterator[str]:
    """On each host, no path held by two live environments, nor one inside another's."""
    held: dict[str, dict[str, str]] = defaultdict(dict)
    for event in log:
        if event["type"] == "host_claims_started":
            held[event["hostId"]].update(event["held"])
        elif event["type"] == "host_claims_held":
            on_host, path = held[event["hostId"]], event["path"]
            for other, holder in on_host.items():
                if holder != event["environmentId"] and (
                    other == path or other.startswith(path + "/") or path.startswith(other + "/")
                ):
                    yield f"{event['hostId']}: {path} held by {event['environmentId']} while {other} is {holder}'s"
            on_host[path] = event["environmentId"]
        elif event["type"] == "host_claims_released":
            held[event["hostId"]].pop(event["path"], None)


def check_hooks(marker: Path, log: list[dict[str, Any]]) -> Iterator[str]:
    """Each hook at most once per environment; a ready environment's setup exactly once. A hook
    wrote the workspace it ran in (each environment's own: its path key is new for each)."""
    environments = environment_events(log)
    environment_at = {
        os.path.realpath(event["path"]): environment_id
        for environment_id, events in environments.items()
        for event in events
        if event["type"] == "created"
    }
    runs: Counter[tuple[str, str]] = Counter()
    for line in marker.read_text().splitlines() if marker.exists() else []:
        hook, workspace = line.split(" ", 1)
        if workspace not in environment_at:
            yield f"a {hook} hook ran in {workspace}, the workspace of no environment"
        runs[(hook, environment_at.get(workspace, workspace))] += 1
    for (hook, environment_id), count in runs.items():
        if count > 1:
            yield f"environment {environment_id}: {hook} ran {count} times"
    for environment_id, events in environments.items():
        if events[-1]["status"] == "ready" and runs[("setup", environment_id)] != 1:
            yield f"environment {environment_id} is ready, its setup ran {runs[('setup', environment_id)]} times"


async def check_streams(topology: Topology, log: list[dict[str, Any]], announced: Counter[str]) -> list[str]:
    """Each event of the log once in BB_ENVIRONMENTS, in order; each readiness once there and at most
    once on bb.environments.>; no placement `ready` stored after its environment's `removed`."""
    violations = []
    nc = await connect(topology, "service")
    try:
        js = nc.jetstream()
        stored = await stored_messages(js, subjects.ENVIRONMENTS_STREAM, subjects.LOG_EVENTS)
        placements = await stored_messages(js, subjects.PLACEMENTS_STREAM, subjects.PLACEMENT_EVENTS)
    finally:
        await closed(nc)
    claimed = [subjects.claimed_notification_id(message.headers) for message in stored]
    if doubled := [n for n, count in Counter(claimed).items() if count > 1]:
        violations.append(f"notifications stored more than once in {subjects.ENVIRONMENTS_STREAM}: {doubled[:20]}")
    ready_stored = Counter(json.loads(m.data)["environmentId"] for m in stored if m.subject.endswith(".ready"))
    for environment_id, events in environment_events(log).items():
        in_log = sum(event["type"] == "ready" for event in events)
        if ready_stored[environment_id] != in_log:
            violations.append(
                f"environment {environment_id}: ready {ready_stored[environment_id]} times in "
                f"{subjects.ENVIRONMENTS_STREAM}, {in_log} in the log"
            )
        if announced[environment_id] > 1:
            violations.append(
                f"environment {environment_id}: ready announced {announced[environment_id]} times "
                f"on {subjects.ENVIRONMENT_EVENTS}"
            )
    removed_at = {
        json.loads(m.data)["environmentId"]: m.metadata.timestamp for m in stored if m.subject.endswith(".removed")
    }
    outcomes: Counter[tuple[str, str | None, str]] = Counter()
    for message in placements:
        outcome = json.loads(message.data)
        outcomes[(outcome["threadId"], outcome["environmentId"], outcome["status"])] += 1
        removed = removed_at.get(outcome["environmentId"])
        if outcome["status"] == "ready" and removed is not None and message.metadata.timestamp > removed:
            violations.append(
                f"placement ready of {outcome['threadId']} stored at {message.metadata.timestamp}, "
                f"after its environment {outcome['environmentId']} was removed at {removed}"
            )
    violations += [f"placement {key} stored {count} times" for key, count in outcomes.items() if count > 1]
    return violations


def check_disks(
    topology: Topology, repos: dict[str, Path], log: list[dict[str, Any]], documents: dict[str, dict[str, Any]]
) -> Iterator[str]:
    """No workspace and no worktree of git's left for a removed environment; the read model agrees with the log."""
    environments = environment_events(log)
    for environment_id, events in environments.items():
        status, document = events[-1]["status"], documents.get(environment_id)
        if document is None or document["status"] != status:
            yield f"environment {environment_id} is {status} in the log, listed as {document and document['status']}"
    live_keys = {(d["hostId"], d["pathKey"]) for d in documents.values() if d["status"] != "removed"}
    for host, repo in repos.items():
        for workspace in sorted(topology.agent_root(host).glob("providers/*/worktrees/*")):
            if (host, workspace.name) not in live_keys:
                yield (
                    f"{host}: {workspace} is left on disk, no live environment has its key; in the log: "
                    f"{lived(environments, workspace.name)}"
                )
        listed = subprocess.run(
            ["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True, text=True, check=True
        ).stdout
        live_paths = {d["path"] for d in documents.values() if d["status"] != "removed" and d["hostId"] == host}
        for line in listed.splitlines():
            if (
                line.startswith("worktree ")
                and (path := line.removeprefix("worktree ")) != str(repo)
                and path not in live_paths
            ):
                yield f"{host}: git worktree list still has {path}"


def lived(environments: dict[str, list[dict[str, Any]]], path_key: str) -> str:
    """What the log says of the environments of a path key (a thread's id), for a violation's report."""
    lives = [
        f"{environment_id}: " + ", ".join(f"{event['type']}@{event['occurredAt'][11:23]}" for event in events)
        for environment_id, events in environments.items()
        if any(path_key in event.get("threadIds", ()) for event in events)
    ]
    return "; ".join(lives) or "no environment"


def availability_gaps(plan: list[Fault], threads: dict[str, Thread], log: list[dict[str, Any]]) -> list[str]:
    """For each fault, the time until the first thread placed after it was ready, and until its
    environment was first in the log (the thread event's way in, before the environment's own steps)."""
    environments = environment_events(log)
    ready_at: dict[str, float] = {}
    logged_at: dict[str, float] = {}
    for events in environments.values():
        for event in events:
            at = datetime.fromisoformat(event["occurredAt"]).timestamp()
            for thread_id in event["threadIds"]:
                logged_at.setdefault(thread_id, at)
                if event["type"] == "ready":
                    ready_at.setdefault(thread_id, at)
    lines = []
    placed = sorted(threads.values(), key=lambda thread: thread.placed_at)
    for fault in plan:
        if fault.began is None:
            lines.append(f"{fault}: not done")
            continue
        after = next((t for t in placed if t.placed_at >= fault.began and t.id in ready_at), None)
        gap = (
            (
                f"{ready_at[after.id] - fault.began:5.1f} s ({after.id}, in the log after "
                f"{logged_at[after.id] - after.placed_at:.1f} s)"
            )
            if after
            else "no thread placed after it was ready"
        )
        back = f"back after {fault.back_after_s:.1f} s" if fault.back_after_s is not None else "not back"
        lines.append(f"{fault}  ({back}): next placed thread ready {gap}")
    return lines


def error_lines(topology: Topology) -> list[str]:
    """What the parts logged as going wrong, a few lines each, for the report of a failed run (a
    node's routes refused while another is down are expected, and left out)."""
    logs: dict[Path, tuple[str, ...]] = {
        path: ("ERROR", "Traceback", "exited", "bb: ") for path in map(topology.log, (*REPLICAS, *HOSTS))
    }
    logs |= {path: ("critical", "mismatch") for path in sorted(topology.base.glob("nats/n*/nats-server.log"))}
    lines = []
    for path, words in logs.items():
        if path.exists():
            found = [
                line for line in path.read_text(errors="replace").splitlines() if any(word in line for word in words)
            ]
            lines += [f"{path.parent.name}/{path.name}: {line[:300]}" for line in found[-8:]]
    return lines


@pytest.mark.nemesis
async def test_nemesis_random_faults_break_none_of_the_promises(tmp_path: Path) -> None:
    asked = os.environ.get("BB_NEMESIS_SEED") or str(DEFAULT_SEED)
    seed = random.SystemRandom().randrange(1 << 31) if asked == "random" else int(asked)
    rng = random.Random(seed)
    plan = plan_faults(rng, fault_menu())
    say(
        f"nemesis seed {seed} (BB_NEMESIS_SEED={seed} replays it): {len(plan)} faults over {FAULTS_S:.0f} s, "
        f"{THREADS_PER_S} threads/s"
    )
    for fault in plan:
        say(f"  {fault}")

    marker = tmp_path / "hooks.log"  # outside every workspace: each hook appends its name and workspace
    repos = {}
    for host in HOSTS:
        repo = repos[host] = tmp_path / f"repo-{host}"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        write_hooks(
            repo,
            tmp_path / "hook-names.log",
            setup=f'echo "setup $(pwd -P)" >> {marker}',
            teardown=f'echo "teardown $(pwd -P)" >> {marker}',
        )
    (tmp_path / "topology").mkdir()
    topology = await asyncio.to_thread(
        Topology.start,
        tmp_path / "topology",
        REPLICAS,
        HOSTS,
        {"BB_RETIRE_GRACE_MS": "0", "BB_SWEEP_INTERVAL_S": "1", "BB_LOG_LEVEL": "INFO"},
    )
    # The engines' PostgreSQL trades durability for speed (synchronous_commit off): killed, it would
    # lose transactions it had acknowledged, which no service survives. A crash here loses nothing.
    with psycopg.connect(topology.postgres.url("postgres"), autocommit=True) as connection:  # type: ignore[union-attr]
        connection.execute("ALTER SYSTEM SET synchronous_commit = on")
        connection.execute("SELECT pg_reload_conf()")
    nemesis = Nemesis(topology, plan)
    announced: Counter[str] = Counter()
    subscriber = await connect(topology, "subscriber")
    try:

        async def heard(message: Any) -> None:
            announced[message.subject.split(".")[2]] += 1

        await subscriber.subscribe(subjects.environment_event("*", "ready"), cb=heard)
        workload = Workload(topology, repos, random.Random(seed + 1))
        began = time.monotonic()
        watcher = asyncio.create_task(nemesis.watch())
        try:
            await asyncio.gather(workload.run(began + FAULTS_S), nemesis.run(began))
        finally:
            watcher.cancel()
        say(f"{clock(time.time())} healed: every part runs; {len(workload.threads)} threads placed")

        log = await settle(topology, workload.threads)
        documents = await read_model(topology, log)
        violations = [
            *nemesis.violations,
            *workload.violations,
            *check_environments(workload.threads, log),
            *check_claims(log),
            *check_hooks(marker, log),
            *await check_streams(topology, log, announced),
            *check_disks(topology, repos, log, documents),
        ]
        for line in availability_gaps(plan, workload.threads, log):
            say(line)
        if violations:
            say(f"{len(violations)} promises broken:")
            for violation in violations:
                say(f"  {violation}")
            say("what the parts logged as going wrong:")
            for line in error_lines(topology):
                say(f"  {line}")
        assert not violations, f"seed {seed}: {len(violations)} promises broken:\n" + "\n".join(violations[:60])
    finally:
        await closed(subscriber)
        await asyncio.to_thread(topology.stop)
