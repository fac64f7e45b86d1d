"""A project's `origin` on the network, as a Modal sandbox needs it: a bare repository served by a
real `git daemon` on 127.0.0.1 (read and push), so `git ls-remote` and `git clone` reach it over
git://, which the modal-sandbox provider takes for a remote, not a local path."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bb_environments.bus.embedded_server import free_port

STARTS_WITHIN_S = 10.0


@contextmanager
def served_origin(project: Path, served: Path) -> Iterator[str]:
    """Serve a bare copy of `project` (its branches) under `served`, add it as the project's
    `origin`, and yield its git:// URL; the daemon is stopped on leaving."""
    bare = served / "project.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--", str(project), str(bare)], check=True)
    port = free_port()
    daemon = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            "--enable=receive-pack",
            "--listen=127.0.0.1",
            f"--port={port}",
            f"--base-path={served}",
            str(served),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"git://127.0.0.1:{port}/project.git"
    try:
        _wait_until_served(url)
        subprocess.run(["git", "-C", str(project), "remote", "add", "origin", url], check=True)
        yield url
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait()


def push(project: Path, branch: str = "main") -> None:
    subprocess.run(["git", "-C", str(project), "push", "--quiet", "origin", branch], check=True)


def _wait_until_served(url: str) -> None:
    deadline = time.monotonic() + STARTS_WITHIN_S
    while subprocess.run(["git", "ls-remote", "--", url], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"git daemon never served {url}")
        time.sleep(0.05)
