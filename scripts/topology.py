"""The replicated topology on one machine, from real processes: a PostgreSQL server, a 3-node NATS
cluster, core replicas (`bb serve --no-agent`, each with its own data dir and replica id) and the
agents of registered hosts (`bb agent`), as docs/deploy.md deploys them on several machines.

scripts/try_replicas.py starts it for a user to try, bench/replicas.py to measure it. Every
process runs in a session of its own, so that a Ctrl-C in the terminal reaches only the script,
which then stops them in order: agents, replicas, NATS, PostgreSQL.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from scripts.engines import NODES, NatsCluster, PostgresServer, postgres_owner

STOP_S = 30.0
"""How long a replica or an agent is given to stop on its signal before it is killed."""
POSTGRES = "postgres"
"""The PostgreSQL server's name among the parts (beside replica ids, host ids and NATS nodes)."""


class Topology:
    """Started by `start`, stopped (everything it started, in order) by `stop`.

    Its parts, by name: each replica (its id), each host's agent (the host id), each NATS node
    (n1, n2, n3) and PostgreSQL (`postgres`). `kill`, `pause`, `resume` and `start_again` do to
    one of them what a crash, a frozen machine and a restart would."""

    def __init__(self, base: Path, settings: dict[str, str], stream_replicas: int) -> None:
        self.base = base
        self._settings = settings
        self._stream_replicas = stream_replicas
        self.postgres: PostgresServer | None = None
        self.cluster: NatsCluster | None = None
        self.event_store = ""
        self.replicas: dict[str, subprocess.Popen[bytes]] = {}
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._postgres_apart: Path | None = None
        self._seeds: dict[str, Path] = {}
        self._paused: set[str] = set()

    @classmethod
    def start(
        cls,
        base: Path,
        replicas: tuple[str, ...] = ("r1", "r2"),
        hosts: tuple[str, ...] = ("h1", "h2"),
        settings: dict[str, str] | None = None,
        stream_replicas: int = 3,
    ) -> Topology:
        """Everything, in `base` (an empty directory), once each replica serves and each agent serves
        its host; `settings`: BB_* variables for every replica and agent; `stream_replicas`: the
        replicas' BB_STREAM_REPLICAS (3: every stream survives the loss of a node)."""
        topology = cls(base, settings or {}, stream_replicas)
        try:
            owner = postgres_owner()
            if owner is None:
                (base / "postgres").mkdir()
                topology.postgres = PostgresServer.start(base / "postgres")
            else:
                # Apart from `base`, which may lie in a directory that the server's own user cannot
                # enter (a root's 0700 temporary directory); removed by the stop.
                topology._postgres_apart = Path(tempfile.mkdtemp(prefix="bb-postgres-"))
                topology.postgres = PostgresServer.start(topology._postgres_apart, owner)
            topology.event_store = topology.postgres.create_database("bb")
            topology.cluster = NatsCluster.start(base / "nats")
            for replica_id in replicas:  # one after the other: the first creates the streams
                topology._start_replica(replica_id)
            for host_id in hosts:
                topology._start_agent(host_id)
        except BaseException:
            topology.stop()
            raise
        return topology

    @property
    def nats_urls(self) -> str:
        assert self.cluster is not None
        return self.cluster.urls

    def cli_environment(self) -> dict[str, str]:
        """What `bb` needs to reach the replicas: the cluster and the operator's seed (the service's
        own seed would not do: its user may not read the clients' inboxes)."""
        assert self.cluster is not None
        return {"BB_NATS_URL": self.nats_urls, "BB_NATS_NKEY": str(self.cluster.seed_file("operator"))}

    def seed_file(self, role: str) -> Path:
        """The seed of a client role (`operator`, `publisher`, `subscriber`)."""
        assert self.cluster is not None
        return self.cluster.seed_file(role)

    def pids(self) -> list[int]:
        """The processes at the root of each part: their descendants are theirs (PostgreSQL's backends)."""
        engines = [
            *(self.cluster.pids if self.cluster else []),
            *([self.postgres.pid] if self.postgres and self.postgres.pid else []),
        ]
        return engines + [process.pid for process in (*self.replicas.values(), *self.agents.values())]

    def log(self, name: str) -> Path:
        """The output of a replica or an agent, by its id."""
        return self.base / f"{name}.log"

    def kill(self, part: str) -> None:
        """SIGKILL a replica or an agent (its process alone: a hook's supervisor outlives it) or a NATS
        node; PostgreSQL stops as a crash would (an immediate shutdown). `start_again` brings it back."""
        if part == POSTGRES:
            assert self.postgres is not None
            self.postgres.stop()
        elif part in NODES:
            assert self.cluster is not None
            self.cluster.kill(part)
        else:
            process = self._process(part)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
        self._paused.discard(part)

    def pause(self, part: str) -> None:
        """SIGSTOP a replica, an agent or a NATS node, as a frozen machine (or a long GC) would."""
        if part in NODES:
            assert self.cluster is not None
            self.cluster.pause(part)
        else:
            self._process(part).send_signal(signal.SIGSTOP)
        self._paused.add(part)

    def resume(self, part: str) -> None:
        """SIGCONT a paused part; a NATS node is back once it is healthy again (caught up)."""
        self._continue(part)
        if part in NODES:
            assert self.cluster is not None
            self.cluster.wait_healthy()

    def start_again(self, part: str) -> None:
        """Start a killed part again, on its own data, and return once it serves (a NATS node: once
        it is healthy, caught up with the cluster)."""
        if part == POSTGRES:
            assert self.postgres is not None
            self.postgres.start_again()
        elif part in NODES:
            assert self.cluster is not None
            self.cluster.start_node(part)
            self.cluster.wait_healthy()
        elif part in self.replicas:
            self._start_replica(part)
        else:
            self._run_agent(part)

    def exited(self) -> dict[str, int]:
        """The replicas and agents whose process has ended, with its exit status."""
        return {
            name: status
            for name, process in (*self.replicas.items(), *self.agents.items())
            if (status := process.poll()) is not None
        }

    def stop(self) -> None:
        """Stop whatever runs of it, however far its start got."""
        for part in list(self._paused):  # a stopped process would not hear its signal
            self._continue(part)
        for process in (*self.agents.values(), *self.replicas.values()):
            # SIGINT: a replica stopped just after its start has not yet put its SIGTERM handler in place
            # (see bench/common.py's stop_service); the agent takes either.
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
        for process in (*self.agents.values(), *self.replicas.values()):
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.agents.clear()
        self.replicas.clear()
        if self.cluster is not None:
            self.cluster.stop()
        if self.postgres is not None:
            self.postgres.stop()
        if self._postgres_apart is not None:
            shutil.rmtree(self._postgres_apart, ignore_errors=True)

    def _environment(self, data_dir: Path, **settings: str) -> dict[str, str]:
        # The caller's own BB_* settings (a BB_DATA_DIR of theirs) stay out: each process gets its own.
        inherited = {name: value for name, value in os.environ.items() if not name.startswith("BB_")}
        return {**inherited, "BB_DATA_DIR": str(data_dir), **self._settings, **settings}

    def _spawn(self, name: str, arguments: list[str], environment: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log(name), "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "bb_environments.entrypoints.bb", *arguments],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def _start_replica(self, replica_id: str) -> None:
        assert self.cluster is not None
        data_dir = self.base / replica_id
        process = self._spawn(
            replica_id,
            ["serve", "--no-agent", "--replica-id", replica_id],
            self._environment(
                data_dir,
                BB_EVENT_STORE=self.event_store,
                BB_NATS_URL=self.nats_urls,
                BB_STREAM_REPLICAS=str(self._stream_replicas),
                BB_NATS_NKEY=str(self.cluster.seed_file("service")),
            ),
        )
        self.replicas[replica_id] = process
        # server.json is written once its API answers on the bus.
        self._until(lambda: _serves(data_dir / "server.json", process.pid), replica_id, f"replica {replica_id}")

    def _start_agent(self, host_id: str) -> None:
        """Register the host through the replicas, admit its seed on every node, start its agent."""
        assert self.cluster is not None
        registered = subprocess.run(
            [sys.executable, "-m", "bb_environments.entrypoints.bb", "machine", "register", host_id, "--json"],
            env={**os.environ, **self.cli_environment()},
            capture_output=True,
            text=True,
        )
        if registered.returncode != 0:
            raise RuntimeError(f"bb machine register {host_id} failed: {registered.stderr.strip()}")
        seed = Path(json.loads(registered.stdout)["credentials"])
        self.cluster.admit_host(host_id, seed)
        self._seeds[host_id] = seed
        self._run_agent(host_id)

    def agent_root(self, host_id: str) -> Path:
        """Where the agent of `host_id` keeps the workspaces it owns (its `--root`)."""
        return self.base / host_id / "root"

    def _run_agent(self, host_id: str) -> None:
        """The agent of a registered host, once it serves (says so in its log after this start)."""
        log = self.log(host_id)
        start = log.stat().st_size if log.exists() else 0
        process = self._spawn(
            host_id,
            [
                "agent",
                "--host-id",
                host_id,
                "--credentials",
                str(self._seeds[host_id]),
                "--nats-url",
                self.nats_urls,
                "--root",
                str(self.agent_root(host_id)),
            ],
            self._environment(self.base / host_id / "data", BB_LOG_LEVEL="INFO"),
        )
        self.agents[host_id] = process
        self._until(lambda: "is serving from" in _read_from(log, start), host_id, f"the agent of {host_id}")

    def _continue(self, part: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            if part in NODES:
                assert self.cluster is not None
                self.cluster.resume(part)
            else:
                self._process(part).send_signal(signal.SIGCONT)
        self._paused.discard(part)

    def _process(self, name: str) -> subprocess.Popen[bytes]:
        """The process of a replica or an agent, by its id."""
        return {**self.replicas, **self.agents}[name]

    def _until(self, condition: Callable[[], bool], name: str, what: str, timeout: float = 60) -> None:
        """Wait for `condition` of the process `name` (a replica or agent id), `what` for the error."""
        process = self._process(name)
        deadline = time.monotonic() + timeout
        while not condition():
            if process.poll() is not None:
                raise RuntimeError(
                    f"{what} exited with status {process.returncode} before serving; the end of "
                    f"{self.log(name)}:\n{self.log(name).read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not serve within {timeout:.0f} s")
            time.sleep(0.05)


def _read_from(log: Path, start: int) -> str:
    with open(log, "rb") as file:
        file.seek(start)
        return file.read().decode(errors="replace")


def _serves(server_file: Path, pid: int) -> bool:
    """The replica `pid` wrote `server_file` (not one a killed run left behind)."""
    try:
        return bool(json.loads(server_file.read_text())["pid"] == pid)
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return False
