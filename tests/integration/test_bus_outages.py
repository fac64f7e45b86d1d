"""The bus going away under a real `bb serve` and under the CLI (issue 10, items 2 and 7).

The service rides an outage out: it keeps running, every environment in flight ends ready with
each hook run once, and its log says that the bus went away and came back, in a line each, not a
line per reconnect attempt. A command cut off from the service ends with exit 4 and one sentence,
never a traceback; a spawn whose answer was lost names its thread, and sent again it is answered
for that thread instead of spawning another.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import nats
import pytest

from bb_environments.bus.embedded_server import (
    LOCK_FILE,
    SERVER_NAME,
    EmbeddedNats,
    NatsServerUnavailable,
    ServerRecord,
    SupervisedNats,
    accepts_connections,
    free_port,
    nats_server_binary,
)
from bb_environments.bus.wire.api_messages import SpawnThread
from bb_environments.providers.host.file_lock import FileLock, read_holder
from tests.integration.conftest import Result, Service, answer_lost_to_a_killed_service, service_environment

SPAWNS = 3
ENVIRONMENT = "8f14e45f-ceea-4e7f-9f2b-6f1bc5e9a0c1"  # names nothing: the service never gets to answer
LOST_LINE, BACK_LINE = "lost the NATS bus", "the NATS bus is back"


def commands(thread: str) -> list[tuple[str, ...]]:
    """Every command that talks to the service, as a user would type it."""
    spawn = ("thread", "spawn", "--environment-provider", "personal-workspace")
    return [
        ("environment", "providers"),
        ("environment", "list"),
        ("environment", "show", ENVIRONMENT),
        ("environment", "delete", ENVIRONMENT),
        ("environment", "retry", ENVIRONMENT),
        (*spawn, "--thread-id", f"{thread}-a"),
        (*spawn, "--thread-id", f"{thread}-b", "--wait"),
        ("thread", "list"),
        ("thread", "archive", thread),
        ("thread", "unarchive", thread),
        ("thread", "cancel", thread),
        ("events", "tail"),
        ("events", "replay"),
        ("events", "export"),
    ]


def one_sentence(result: Result) -> str:
    """The error line: the last on stderr, after nothing but the transcript `--wait` streams."""
    assert "Traceback" not in result.stderr, result.stderr
    *progress, said = result.stderr.strip().splitlines()
    assert said.startswith("bb: ") and all(line.startswith(("» ", "  ")) for line in progress), result.stderr
    return said


def assert_unreachable(command: tuple[str, ...], result: Result, as_json: bool) -> str:
    assert result.returncode == 4, (command, result.returncode, result.stderr)
    said = one_sentence(result)
    if as_json:
        assert result.json()["error"]["code"] == "unreachable", (command, result.stdout)
    return said


def setup_that_takes(repo: Path, marker: Path, script: str) -> None:
    """A setup hook that records its workspace in `marker` (one line per run), then runs `script`."""
    (repo / ".bb-env-setup.sh").write_text(f"pwd >> {marker}\n{script}\n")
    subprocess.run(["git", "-C", str(repo), "add", ".bb-env-setup.sh"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo), "commit", "-qm", "setup"], check=True
    )


def runs(marker: Path) -> list[str]:
    return marker.read_text().split() if marker.exists() else []


async def eventually(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def spawn_in_flight(service: Service, repo: Path, marker: Path) -> list[str]:
    """SPAWNS environments whose setup hooks are running."""
    environments = []
    for n in range(SPAWNS):
        spawned = await service.api.call(
            "threads",
            "spawn",
            SpawnThread(thread_id=f"t{n}", environment_provider="git-worktree", project_path=str(repo)),
        )
        environments.append(spawned["environmentId"])
    await eventually(lambda: len(runs(marker)) == SPAWNS, "every setup hook started")
    return environments


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet: either way it serves nothing any more."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def log_since(service: Service, offset: int) -> list[str]:
    return (service.data_dir.parent / "serve.log").read_bytes()[offset:].decode().splitlines()


def log_size(service: Service) -> int:
    return (service.data_dir.parent / "serve.log").stat().st_size


async def assert_all_ready_each_setup_once(service: Service, environments: list[str], marker: Path) -> None:
    for environment_id in environments:
        await service.wait_for(environment_id, "ready", timeout=90)
    assert sorted(runs(marker)) == sorted(set(runs(marker))) and len(runs(marker)) == SPAWNS, runs(marker)


async def outage_told_once(service: Service, offset: int) -> list[str]:
    """The service's log lines since `offset`, once it told that the bus is back (a moment after
    it is, lest a flap be told as a second outage)."""
    await eventually(
        lambda: any(BACK_LINE in line for line in log_since(service, offset)), "the bus back told", timeout=30
    )
    lines = log_since(service, offset)
    assert not [line for line in lines if "Traceback" in line], lines
    for said in (LOST_LINE, BACK_LINE):
        assert sum(said in line for line in lines) == 1, (said, lines)
    return lines


# -- item 2: the service ----------------------------------------------------------------------------


async def test_a_killed_embedded_nats_server_is_ridden_out_in_a_few_lines(service, git_repo, tmp_path):
    marker = tmp_path / "setups"
    setup_that_takes(git_repo, marker, "sleep 1")
    environments = await spawn_in_flight(service, git_repo, marker)
    offset = log_size(service)
    killed, port = service.info["natsPid"], service.info["natsPort"]
    os.kill(killed, signal.SIGKILL)
    await eventually(lambda: ended(killed), "the nats-server's end", timeout=10)

    # `bb serve` restarts its server itself; were it not to, one started by hand on the same port,
    # store and configuration must do as well.
    try:
        await eventually(lambda: accepts_connections("127.0.0.1", port), "a restart by bb serve", timeout=5)
    except AssertionError:
        revived = EmbeddedNats.start(
            service.data_dir / "nats", port=port, configuration=service.data_dir / "nats-server.conf"
        )
        service.info["natsPid"] = revived.pid

    await assert_all_ready_each_setup_once(service, environments, marker)
    assert service.process.poll() is None
    lines = await outage_told_once(service, offset)
    # Beside our two lines, at most the restart's own two (the supervisor's).
    assert len(lines) <= 4, lines


def store_locked_by_a_serve(tmp_path: Path) -> tuple[Path, Path, FileLock]:
    """A store dir and configuration as `bb serve` writes them, its lock taken by "the serve" and
    naming a server that has ended; the test hands the lock on, then closes it: the serve is gone."""
    store, configuration = tmp_path / "nats", tmp_path / "nats-server.conf"
    store.mkdir()
    configuration.write_text(json.dumps({"server_name": SERVER_NAME}))
    ended = subprocess.Popen(["true"])
    ended.wait()
    lock = FileLock(store / LOCK_FILE)
    assert lock.acquire()
    lock.record(ServerRecord(ended.pid, free_port()))
    return store, configuration, lock


def test_a_server_started_by_a_serve_killed_before_it_recorded_the_pid_is_reused_not_refused(tmp_path):
    # What `bb serve` leaves when SIGKILL lands while it restarts its dead server: the lock file
    # still names the dead one, and the new one, started with the lock, holds it.
    store, configuration, lock = store_locked_by_a_serve(tmp_path)
    left = EmbeddedNats.start(store, port=free_port(), configuration=configuration, keep_open=lock.fileno())
    lock.close()
    try:
        supervised = SupervisedNats.open(store, configuration, tmp_path / "nats-port")
        assert (supervised.server.pid, supervised.url) == (left.pid, left.url)
        assert read_holder(store / LOCK_FILE, ServerRecord) == ServerRecord(left.pid, left.port)
        supervised.stop()
        assert left.process is not None
        left.process.wait(timeout=10)  # stop() returns once it is a zombie; its threads may still be ending
    finally:
        left.stop()


async def test_a_reused_server_enforces_the_configuration_written_since_it_started(tmp_path):
    # A server left running by a killed serve, then a release (or a new seed) changes who may do what.
    store, configuration, lock = store_locked_by_a_serve(tmp_path)
    left = EmbeddedNats.start(store, port=free_port(), configuration=configuration, keep_open=lock.fileno())
    lock.record(ServerRecord(left.pid, left.port))
    lock.close()
    try:
        await (await nats.connect(left.url)).close()  # admitted without credentials, as configured then
        configuration.write_text(
            json.dumps({"server_name": SERVER_NAME, "authorization": {"users": [{"user": "only", "password": "this"}]}})
        )
        supervised = SupervisedNats.open(store, configuration, tmp_path / "nats-port")
        assert supervised.server.pid == left.pid
        with pytest.raises(Exception, match="Authorization Violation"):
            await nats.connect(left.url, allow_reconnect=False, max_reconnect_attempts=0)
        await (await nats.connect(left.url, user="only", password="this")).close()
        supervised.stop()
    finally:
        left.stop()


def test_a_reused_server_that_refuses_its_new_configuration_is_named_not_served_on(tmp_path):
    store, configuration, lock = store_locked_by_a_serve(tmp_path)
    left = EmbeddedNats.start(store, port=free_port(), configuration=configuration, keep_open=lock.fileno())
    lock.record(ServerRecord(left.pid, left.port))
    lock.close()
    try:
        configuration.write_text("{ not a configuration")
        with pytest.raises(
            NatsServerUnavailable,
            match=f"the running nats-server \\(pid {left.pid}\\) refused its "
            "new configuration: Failed to reload server configuration",
        ):
            SupervisedNats.open(store, configuration, tmp_path / "nats-port")
        assert left.process is not None and left.process.poll() is None  # still serving what it had
    finally:
        left.stop()


def test_a_store_lock_held_only_until_its_holder_ends_is_waited_for_then_taken(tmp_path):
    # What a serve finds when the server it would reuse is just ending: the lock still held, by a
    # process that is not our server, while the record names one that has ended.
    store, configuration, lock = store_locked_by_a_serve(tmp_path)
    ending = subprocess.Popen(["sleep", "1"], pass_fds=(lock.fileno(),))
    lock.close()
    assert ending.poll() is None
    supervised = SupervisedNats.open(store, configuration, tmp_path / "nats-port")
    try:
        assert ending.poll() is not None
        assert accepts_connections("127.0.0.1", supervised.server.port)
        assert read_holder(store / LOCK_FILE, ServerRecord) == ServerRecord(
            supervised.server.pid, supervised.server.port
        )
    finally:
        supervised.stop()


@pytest.fixture
def external_nats(tmp_path: Path):
    """A nats-server of our own, which the test stops and starts again on the same port and store."""
    store, port = tmp_path / "external-nats", free_port()
    servers = [EmbeddedNats.start(store, port=port)]
    try:
        yield servers, store, port
    finally:
        servers[-1].stop()


async def test_an_external_nats_away_for_seconds_is_waited_for_and_nothing_is_lost(external_nats, git_repo, tmp_path):
    servers, store, port = external_nats
    marker = tmp_path / "setups"
    setup_that_takes(git_repo, marker, "sleep 1; echo done")
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir, BB_NATS_URL=f"nats://127.0.0.1:{port}"))
    await service.start()
    try:
        environments = await spawn_in_flight(service, git_repo, marker)
        offset = log_size(service)
        os.kill(servers[-1].pid, signal.SIGKILL)
        servers[-1].reap()
        # Long enough for every loop to back off to its longest pause, and the hooks to end meanwhile.
        await asyncio.sleep(8)
        assert service.process.poll() is None, service.log_tail()
        listed = await service.bb("environment", "list", "--json")
        assert_unreachable(("environment", "list"), listed, as_json=True)
        servers.append(EmbeddedNats.start(store, port=port))

        await assert_all_ready_each_setup_once(service, environments, marker)
        for environment_id in environments:  # the output of hooks that ended while the bus was away
            shown = await service.wait_for(environment_id, lambda e: "done" in e["transcript"])
            assert shown["transcript"].count("done") == 1
        lines = await outage_told_once(service, offset)
        assert len(lines) == 2, lines
    finally:
        await service.stop()


# -- item 7: the CLI --------------------------------------------------------------------------------


async def test_every_command_against_a_dead_or_stopped_service_exits_4_in_one_sentence(tmp_path):
    dead_dir, stopped_dir = tmp_path / "dead", tmp_path / "stopped"
    dead_dir.mkdir()
    stopped_dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (dead_dir / "server.json").write_text(
        json.dumps(
            {"natsUrl": f"nats://127.0.0.1:{free_port()}", "pid": gone.pid, "hostId": "local", "dataDir": str(dead_dir)}
        )
    )
    dead = Service(dead_dir, service_environment(dead_dir))
    stopped = Service(stopped_dir, service_environment(stopped_dir))

    # `events export` and `events replay` need no service: they read the event store itself
    # (test_cli_requests.py, test_replay.py).
    for command in (c for c in commands("t1") if c not in (("events", "export"), ("events", "replay"))):
        assert_unreachable(command, await dead.bb(*command, "--json"), as_json=True)
        said = assert_unreachable(command, await stopped.bb(*command), as_json=False)
        assert "bb serve" in said, said


async def test_every_command_cut_off_mid_request_exits_4_in_one_sentence(service):
    # Requests reach the service, which is stopped and cannot answer; then its nats-server and
    # the service itself are killed under them.
    seen: list[str] = []

    async def saw(message) -> None:
        seen.append(message.subject)

    sniffer = await service.connect("service")
    await sniffer.subscribe("bb.api.>", cb=saw)
    await sniffer.flush()
    service.process.send_signal(signal.SIGSTOP)
    in_flight = [command for command in commands("t1") if command != ("events", "export")]
    running = [asyncio.create_task(service.bb(*command, "--json")) for command in in_flight]
    try:
        requests = sum(1 for command in in_flight if command[:2] != ("events", "tail"))
        await eventually(lambda: len(seen) == requests, f"{requests} requests at the service", timeout=90)
        await sniffer.close()
        # `events export` reads the stream, not the service: it is cut off while it connects.
        os.kill(service.info["natsPid"], signal.SIGSTOP)
        running.append(asyncio.create_task(service.bb("events", "export", "--json")))
        in_flight.append(("events", "export"))
        await asyncio.sleep(1)
    finally:
        await sniffer.close()
        os.kill(service.info["natsPid"], signal.SIGKILL)
        service.kill()
    started = time.monotonic()
    results = await asyncio.gather(*running)
    assert time.monotonic() - started < 30  # none waited for its timeout
    for command, result in zip(in_flight, results):
        said = assert_unreachable(command, result, as_json=True)
        if command[:2] == ("thread", "spawn"):  # the request went out: it may have been recorded
            thread = command[command.index("--thread-id") + 1]
            assert f"thread {thread} may have been spawned" in said and "bb thread list" in said, said
            assert result.json()["error"]["threadId"] == thread


async def test_a_spawn_whose_service_died_before_answering_names_its_thread_at_once(service):
    result, waited = await answer_lost_to_a_killed_service(
        service, "bb.api.threads.spawn", "thread", "spawn", "--environment-provider", "personal-workspace"
    )
    assert waited < 10  # not the request's timeout of a minute
    said = assert_unreachable(("thread", "spawn"), result, as_json=False)
    assert f"pid {service.info['pid']}" in said and "ended" in said, said
    thread = said.split("thread ", 1)[1].split()[0]  # generated by the CLI, named to the user

    await service.start()
    again = await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", thread, "--json"
    )
    assert again.returncode == 0, again.stderr
    assert again.json()["threadId"] == thread


async def test_spawn_wait_cut_off_names_its_environment_and_the_same_spawn_is_answered_not_repeated(
    service, git_repo, tmp_path
):
    marker, hold = tmp_path / "setups", tmp_path / "hold-setup"
    setup_that_takes(git_repo, marker, f"while [ -e {hold} ]; do sleep 0.05; done")
    hold.touch()
    spawn = (
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "w1",
        "--wait",
        "--json",
    )
    waiting = asyncio.create_task(service.bb(*spawn))
    await eventually(lambda: len(runs(marker)) == 1, "the setup hook started")

    os.kill(service.info["natsPid"], signal.SIGKILL)
    service.kill()
    cut_off = await waiting
    said = assert_unreachable(spawn, cut_off, as_json=True)
    environment_id = cut_off.json()["error"]["environmentId"]
    assert f"environment {environment_id} of thread w1" in said and f"bb environment show {environment_id}" in said
    assert cut_off.json()["error"]["threadId"] == "w1"

    await service.start()
    hold.unlink()
    again = await service.bb(*spawn)
    assert again.returncode == 0, again.stderr
    assert again.json()["environmentId"] == environment_id and again.json()["status"] == "ready"
    assert len(runs(marker)) == 1  # joined after the restart, not run again

    other = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "w1")
    assert other.returncode == 2 and "already exists" in one_sentence(other)
    threads = (await service.bb("thread", "list", "--json")).json()["threads"]
    assert [t["environmentId"] for t in threads if t["id"] == "w1"] == [environment_id]


# -- item 2: a cluster losing the node that holds a stream ------------------------------------------


class ClusterNode:
    """One nats-server of a three-node JetStream cluster on loopback, killed and started again by the test."""

    def __init__(self, directory: Path, name: str, port: int, route_port: int, routes: list[int]) -> None:
        directory.mkdir(parents=True)
        self.name, self.port = name, port
        self.configuration = directory / "nats.conf"
        self.configuration.write_text(
            json.dumps(
                {
                    "server_name": name,
                    "listen": f"127.0.0.1:{port}",
                    "jetstream": {"store_dir": str(directory / "store")},
                    "cluster": {
                        "name": "bb",
                        "listen": f"127.0.0.1:{route_port}",
                        "routes": [f"nats-route://127.0.0.1:{route}" for route in routes],
                    },
                }
            )
        )
        self.log = directory / "nats-server.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(self.configuration)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
async def cluster(tmp_path: Path):
    ports = [(free_port(), free_port()) for _ in range(3)]
    nodes = [
        ClusterNode(tmp_path / f"n{i}", f"n{i}", port, route, [r for _, r in ports if r != route])
        for i, (port, route) in enumerate(ports)
    ]
    for node in nodes:
        node.start()
    try:
        await eventually(lambda: all(accepts_connections("127.0.0.1", node.port) for node in nodes), "the cluster")
        nc = await nats.connect(f"nats://127.0.0.1:{nodes[0].port}")
        try:
            for _ in range(200):  # until JetStream has its meta leader
                try:
                    await nc.jetstream().account_info()
                    break
                except nats.errors.Error:
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()
        yield nodes
    finally:
        for node in nodes:
            node.kill()


async def test_a_cluster_losing_the_node_that_holds_a_stream_is_ridden_out(cluster, tmp_path):
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir, BB_NATS_URL=f"nats://127.0.0.1:{cluster[0].port}"))
    await service.start()
    try:
        first = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--wait", "--json")
        assert first.returncode == 0, first.stderr
        leader = (await service.api.nc.jetstream().stream_info("BB_ENVIRONMENTS")).cluster.leader
        holder = next(node for node in cluster if node.name == leader)
        offset = log_size(service)
        holder.kill()

        # Its stream, its consumers, maybe the connection: all away for a while; a spawn meanwhile.
        lost = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "personal-workspace",
            "--thread-id",
            "during",
            "--json",
            timeout=120,
        )
        await asyncio.sleep(6)
        assert service.process.poll() is None, service.log_tail()
        holder.start()

        if lost.returncode == 0:
            environment_id = lost.json()["environmentId"]
        else:  # answered "unreachable" (4): the same spawn again, once the service can answer
            assert_unreachable(("thread", "spawn"), lost, as_json=True)
            for _ in range(60):
                again = await service.bb(
                    "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "during", "--json"
                )
                if again.returncode == 0:
                    break
                await asyncio.sleep(1)
            assert again.returncode == 0, again.stderr
            environment_id = again.json()["environmentId"]
        await service.wait_for(environment_id, "ready", timeout=90)
        await outage_told_once(service, offset)  # every loop back on its stream, after its longest pause at most
    finally:
        await service.stop()


async def test_a_spawn_sent_again_publishes_its_prompt_once(service):
    spawn = (
        "thread",
        "spawn",
        "--environment-provider",
        "personal-workspace",
        "--thread-id",
        "p1",
        "--prompt",
        "hello",
        "--json",
    )
    first, again = await service.bb(*spawn), await service.bb(*spawn)
    assert first.returncode == again.returncode == 0, (first.stderr, again.stderr)
    assert again.json()["environmentId"] == first.json()["environmentId"]
    nc = await service.connect("service")
    try:
        info = await nc.jetstream().stream_info("BB_THREADS", subjects_filter="bb.threads.p1.message")
    finally:
        await nc.close()
    assert info.state.subjects == {"bb.threads.p1.message": 1}


async def test_a_spawn_sent_again_is_answered_as_the_first_even_where_it_could_not_be_placed_now(service, git_repo):
    """A caller whose answer was lost sends its spawn again; the thread exists, so it gets the
    first answer, whatever placing it again would say now (its branch has since been taken)."""
    spawn = (
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--environment-inputs",
        '{"branch": {"kind": "new", "name": "feature-x"}}',
        "--thread-id",
        "again",
        "--json",
    )
    first = await service.bb(*spawn)
    assert first.returncode == 0, first.stderr
    await service.wait_for(first.json()["environmentId"], "ready")
    other = await service.bb(*spawn[:-3], "--thread-id", "other", "--json")
    assert other.returncode == 2 and "feature-x" in other.json()["error"]["message"], (
        other.stdout
    )  # placing it fails now

    again = await service.bb(*spawn)

    assert again.returncode == 0, again.stderr
    assert again.json()["environmentId"] == first.json()["environmentId"]
