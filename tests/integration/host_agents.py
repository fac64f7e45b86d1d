"""A host agent as a process of its own (`bb agent`), sharing nothing with the service but the bus."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.conftest import Service, service_environment

STARTUP_SECONDS = 30


@dataclass
class Agent:
    """`bb agent` for `host_id`, with a data dir and a root of its own."""

    service: Service
    host_id: str
    credentials: Path
    base: Path
    environment: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    python: list[str] = field(default_factory=lambda: [sys.executable])
    """How to start Python (an unprivileged user may not reach this venv's interpreter: see python_for)."""
    process: subprocess.Popen | None = None

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def log_path(self) -> Path:
        return self.base / "agent.log"

    def start(self, **overrides: str) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        environment = {**service_environment(self.base / "data", **self.environment), **overrides}
        if self.user is not None:
            environment["HOME"] = str(self.base)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    *self.python,
                    "-m",
                    "bb_environments.entrypoints.bb",
                    "agent",
                    "--host-id",
                    self.host_id,
                    "--credentials",
                    str(self.credentials),
                    "--nats-url",
                    self.service.info["natsUrl"],
                    "--root",
                    str(self.root),
                ],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                user=self.user,
                process_group=0,
            )

    async def serving(self) -> None:
        """Wait until the agent says it serves (its jobs' consumer is bound, its heartbeat sent)."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while "is serving from" not in self.log():
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"bb agent exited with {self.process.returncode}: {self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"bb agent did not start within {STARTUP_SECONDS} s: {self.log()[-3000:]}")
            await asyncio.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the agent alone, as a crash would: the hooks' supervisors live on."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    async def died(self, timeout: float = 60) -> int:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError("the agent did not end")
            await asyncio.sleep(0.05)
        return self.process.returncode

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# An interpreter found in the venv's own way, for a user that cannot reach the venv's: the same
# version's system Python, with the venv's site-packages added as site directories (its .pth files
# included, so the package installed in editable mode is found), then the CLI run as `-m` would.
_WITH_THE_VENVS_PACKAGES = (
    "import runpy, site, sys; [site.addsitedir(d) for d in sys.argv.pop(1).split(':')]; "
    "assert sys.argv.pop(1) == '-m'; module = sys.argv.pop(1); sys.argv[0] = module; "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def python_for(user: str, cwd: Path) -> list[str] | None:
    """A way for `user` to run this checkout's Python with the venv's packages, or None."""
    system_python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    for python in ([sys.executable], [system_python, "-c", _WITH_THE_VENVS_PACKAGES, ":".join(site.getsitepackages())]):
        try:
            probe = subprocess.run(
                [*python, "-m", "bb_environments.entrypoints.bb", "--version"],
                user=user,
                capture_output=True,
                env={"PATH": os.environ["PATH"], "HOME": str(cwd)},
                cwd=cwd,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return python
    return None


async def register(service: Service, host_id: str) -> dict[str, Any]:
    registered = await service.bb("machine", "register", host_id, "--json")
    assert registered.returncode == 0, registered.stderr
    return registered.json()


async def machines(service: Service) -> dict[str, dict[str, Any]]:
    listed = await service.bb("machine", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {m["id"]: m for m in listed.json()["machines"]}


@contextlib.asynccontextmanager
async def running_agent(service: Service, host_id: str, base: Path, **options: Any):
    credentials = Path((await register(service, host_id))["credentials"])
    agent = Agent(service, host_id, credentials, base, **options)
    agent.start()
    try:
        await agent.serving()
        yield agent
    finally:
        agent.stop()
