"""A real `bb serve` (a subprocess with its embedded nats-server) per test, and ways to talk to it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.aio.client
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from bb_environments.bus.access import SERVICE_INBOX_PREFIX
from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.embedded_server import EmbeddedNats
from bb_environments.bus.jetstream import JetStream
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import EnvironmentRef, ListThreads
from bb_environments.bus.wire.subjects import claimed_notification_id
from bb_environments.providers.host.processes import pid_alive

STARTUP_SECONDS = 30
SETTLED = {"ready", "error", "removed"}


@contextlib.asynccontextmanager
async def plain_jetstream(store_dir: Path, stream: api.StreamConfig) -> AsyncIterator[JetStream]:
    """A nats-server without permissions, holding `stream`, and a JetStream context on it."""
    server = EmbeddedNats.start(store_dir)
    nc = await nats.connect(server.url)
    try:
        context = JetStream(nc)
        await context.add_stream(stream)
        yield context
    finally:
        await nc.close()
        server.stop()


Stored = tuple[int | None, str, bytes]  # (claimed notification id, subject, payload) of a stream message


async def stream_log(js: JetStreamContext) -> list[Stored]:
    """Every message BB_ENVIRONMENTS holds, in order, read back with an ordered consumer."""
    return [
        (claimed_notification_id(message.headers), message.subject, message.data)
        for message in await stored_messages(js, subjects.ENVIRONMENTS_STREAM, subjects.LOG_EVENTS)
    ]


async def stored_messages(js: JetStreamContext, stream: str, subject: str) -> list[Msg]:
    """Every message of `stream` on `subject` (a filter), in stream order, read back with an ordered consumer."""
    if (await js.stream_info(stream)).state.messages == 0:
        return []
    subscription = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    stored: list[Msg] = []
    try:
        while True:
            message = await subscription.next_msg(timeout=10)
            stored.append(message)
            if message.metadata.num_pending == 0:
                return stored
    finally:
        await subscription.unsubscribe()


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Service:
    data_dir: Path
    environment: dict[str, str]
    process: subprocess.Popen | None = None
    info: dict[str, Any] = field(default_factory=dict)
    api: ApiClient | None = None
    external_credentials: dict[str, Any] = field(default_factory=dict)
    """Connect options for a service on an external NATS, whose server.json names no seeds."""
    wrapper: tuple[str, ...] = ()
    """A command `bb serve` runs under, which executes its arguments in the same process (the
    service's pid is the one Popen starts)."""

    async def start(self, *options: str) -> None:
        """`bb serve OPTIONS`, once it wrote its server.json."""
        previous_pid = self.info.get("pid")
        log = open(self.data_dir.parent / "serve.log", "ab")
        self.process = subprocess.Popen(
            [*self.wrapper, *self.cli(), "serve", *options],
            env=self.environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            info = _read_json(self.data_dir / "server.json")
            if info and info.get("pid") == self.process.pid and info.get("pid") != previous_pid:
                break
            if self.process.poll() is not None:
                raise RuntimeError(f"bb serve exited with {self.process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"bb serve did not start within {STARTUP_SECONDS} s: {self.log_tail()}")
            await asyncio.sleep(0.05)
        self.info = info
        if self.api is None:
            self.api = await ApiClient.connect(info["natsUrl"], **self.credentials("operator"))

    @staticmethod
    def cli() -> list[str]:
        return [sys.executable, "-m", "bb_environments.entrypoints.bb"]

    def credentials(self, role: str) -> dict[str, str]:
        """nats-py connect options for a role of SPEC section 6 (operator, publisher, subscriber), or the service."""
        if role == "service":  # the service's own identity: for tests that act as its relay
            return {
                "nkeys_seed": str(self.data_dir / "credentials" / "service.nk"),
                "inbox_prefix": SERVICE_INBOX_PREFIX,
            }
        seeds = self.info.get("credentials") or {}
        return {"nkeys_seed": seeds[role]} if role in seeds else self.external_credentials

    async def connect(self, role: str) -> nats.aio.client.Client:
        """A plain NATS connection as `role`, the way a service publishing thread events would connect."""
        return await nats.connect(self.info["natsUrl"], **self.credentials(role))

    def log_tail(self) -> str:
        path = self.data_dir.parent / "serve.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def refresh(self) -> dict[str, Any]:
        """server.json as the running service last wrote it: it names a new natsPid after the
        service restarted its nats-server."""
        current = _read_json(self.data_dir / "server.json")
        if current and self.process is not None and current.get("pid") == self.process.pid:
            self.info = current
        return self.info

    def kill(self) -> None:
        """SIGKILL the service process alone, as a crash would; its nats-server lives on."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    async def stop(self) -> None:
        if self.api is not None:
            await self.api.close()
            self.api = None
        if self.process is not None and self.process.poll() is None:
            self.refresh()
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        nats_pid = self.info.get("natsPid")
        if nats_pid and pid_alive(nats_pid):
            os.kill(nats_pid, signal.SIGKILL)

    async def bb(self, *args: str, timeout: float = 120) -> Result:
        process = await asyncio.create_subprocess_exec(
            *self.cli(),
            *args,
            env=self.environment,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except (TimeoutError, asyncio.CancelledError):
            process.kill()
            await process.wait()
            raise
        return Result(process.returncode, out.decode(), err.decode())

    async def spawn(
        self,
        provider: str,
        *options: str,
        project: str | Path | None = None,
        host: str | None = None,
        thread_id: str | None = None,
    ) -> str:
        """`bb thread spawn` of an environment of `provider`, which must be accepted: its id."""
        named = (("--project", project), ("--host", host), ("--thread-id", thread_id))
        arguments = [argument for flag, value in named if value is not None for argument in (flag, str(value))]
        result = await self.bb("thread", "spawn", "--environment-provider", provider, *arguments, *options, "--json")
        assert result.returncode == 0, result.stderr
        return result.json()["environmentId"]

    async def show(self, environment_id: str) -> dict[str, Any]:
        if self.api.nc.is_closed:  # the nats-server was restarted under us
            self.api = await ApiClient.connect(self.info["natsUrl"], **self.credentials("operator"))
        return await self.api.call("environments", "show", EnvironmentRef(environment_id=environment_id))

    async def wait_for(
        self, environment_id: str, condition: Callable[[dict], bool] | str, timeout: float = 60
    ) -> dict[str, Any]:
        """Poll the read model until `condition` holds (a status name or a predicate)."""
        check = (lambda e: e["status"] == condition) if isinstance(condition, str) else condition
        deadline = time.monotonic() + timeout
        while True:
            try:
                environment = await self.show(environment_id)
                if check(environment):
                    return environment
            except Exception as not_yet:  # the service may be restarting
                environment = {"error": str(not_yet)}
            if time.monotonic() > deadline:
                raise AssertionError(f"environment {environment_id} never satisfied the condition: {environment}")
            await asyncio.sleep(0.1)

    async def measured(self, timeout: float = 30) -> None:
        """Wait until every ready environment's workspace of its own was measured (a project
        checkout's is the project's, never measured): the last event its spawn brings
        (`disk_measured`, a moment after its setup settles), after which the log is quiet."""
        deadline = time.monotonic() + timeout
        while True:
            listed = (await self.bb("environment", "list", "--json")).json()["environments"]
            if all(e["diskBytes"] is not None for e in listed if e["status"] == "ready" and e["ownsPath"]):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the ready environments were not all measured within {timeout:.0f} s: {listed}")
            await asyncio.sleep(0.1)

    async def thread_events_handled(self, timeout: float = 60) -> None:
        """Wait until every thread event published so far has been handled and acknowledged
        (threads in different partitions are handled side by side, in no order between them)."""
        nc = await self.connect("service")
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        try:
            while True:
                published = (await js.stream_info(subjects.THREADS_STREAM)).state.last_seq
                mirrored = (await js.stream_info(subjects.THREAD_PARTITIONS_STREAM)).state.last_seq
                consumers = [
                    await js.consumer_info(
                        subjects.THREAD_PARTITIONS_STREAM, subjects.thread_partition_consumer(partition)
                    )
                    for partition in range(subjects.THREAD_PARTITIONS)
                ]
                if mirrored >= published and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in consumers):
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"thread events were not all handled within {timeout:.0f} s")
                await asyncio.sleep(0.05)
        finally:
            await nc.close()

    async def wait_for_thread(self, thread_id: str, having: str | None = None, timeout: float = 30) -> dict:
        """The thread's document once the read model knows it, with its field `having` set if one is
        named (its `environmentId`, or the `refusal` that comes after its first message)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            after = None
            while True:
                page = await self.api.call("threads", "list", ListThreads(after=after))
                found = [t for t in page["threads"] if t["id"] == thread_id and (having is None or t[having])]
                if found:
                    return found[0]
                after = page.get("next")
                if after is None:
                    break
            await asyncio.sleep(0.1)
        raise AssertionError(f"thread {thread_id} never showed up")


class Violations:
    """A connection's permission errors, which the server reports asynchronously."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, error: Exception) -> None:
        self.seen.append(str(error))

    async def wait_for(self, fragment: str, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while not any(fragment.lower() in seen.lower() for seen in self.seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"no permissions violation for {fragment!r}; saw {self.seen}")
            await asyncio.sleep(0.02)


async def connect_as(service: Service, role: str) -> tuple[nats.aio.client.Client, Violations]:
    violations = Violations()
    nc = await nats.connect(service.info["natsUrl"], error_cb=violations.record, **service.credentials(role))
    return nc, violations


async def environment_events(service: Service, environment_id: str) -> list[dict]:
    """The environment's own events in the log, as `bb events export` prints them."""
    exported = await service.bb("events", "export")
    assert exported.returncode == 0, exported.stderr
    events = [json.loads(line) for line in exported.stdout.splitlines()]
    return [e for e in events if e.get("environmentId") == environment_id and "threadIds" in e]


def lifecycle_types(events: list[dict]) -> list[str]:
    """The types of an environment's events, but for its workspace's measurements: one comes a
    moment after the setup settles, between whichever steps follow then."""
    return [e["type"] for e in events if e["type"] != "disk_measured"]


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Wait until `condition()` holds, or fail naming `what` did not happen."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def answer_lost_to_a_killed_service(service: Service, subject: str, *args: str) -> tuple[Result, float]:
    """`bb args`, whose request on `subject` reached the service while it was stopped; then the
    service is killed (its nats-server lives on: only the answer is gone). The command's result,
    and the seconds it took after the kill."""
    arrived = asyncio.Event()

    async def saw(message: Any) -> None:
        arrived.set()

    sniffer = await service.connect("service")
    await sniffer.subscribe(subject, cb=saw)
    await sniffer.flush()
    assert service.process is not None
    service.process.send_signal(signal.SIGSTOP)
    asking = asyncio.create_task(service.bb(*args))
    try:
        await asyncio.wait_for(arrived.wait(), 60)
    finally:
        await sniffer.close()
        service.kill()
    started = time.monotonic()
    result = await asking
    return result, time.monotonic() - started


async def spawn_with_setup_held(service: Service, repo: Path, hold: Path, marker: Path) -> str:
    """Spawn thread t1 on a git worktree whose setup hook has started and runs until `hold` is
    removed (its last command writes nothing); the environment's id."""
    hold.touch()
    write_hooks(repo, marker, setup=f"while [ -e {hold} ]; do sleep 0.02; done")
    environment_id = await service.spawn("git-worktree", project=repo, thread_id="t1")
    await eventually(marker.exists, "the setup hook's start")
    return environment_id


def _read_json(path: Path) -> dict | None:
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):  # missing or damaged (tests damage it on purpose)
        return None
    return content if isinstance(content, dict) else None


def service_environment(data_dir: Path, **overrides: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BB_")}
    repo_root = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, environment.get("PYTHONPATH")]))
    environment.update(
        {
            "BB_DATA_DIR": str(data_dir),
            "BB_RETIRE_GRACE_MS": "0",
            "BB_SWEEP_INTERVAL_S": "1",
            "BB_LOG_LEVEL": "INFO",
            **overrides,
        }
    )
    return environment


@pytest.fixture
async def service(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Service]:
    """Parametrize it indirectly with a dict to add variables to the service's environment."""
    running = Service(tmp_path / "data", service_environment(tmp_path / "data", **getattr(request, "param", {})))
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def write_hooks(repo: Path, marker: Path, setup: str = "", teardown: str = "") -> None:
    """Commit setup/teardown scripts that append their name to `marker` (to count runs)."""
    (repo / ".bb-env-setup.sh").write_text(f"echo setup >> {marker}\necho preparing the workspace\n{setup}\n")
    (repo / ".bb-env-teardown.sh").write_text(f"echo teardown >> {marker}\n{teardown}\n")
    subprocess.run(["git", "-C", str(repo), "add", ".bb-env-setup.sh", ".bb-env-teardown.sh"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo), "commit", "-qm", "hooks"], check=True
    )
