"""An unprivileged OS user made for a test and deleted after it, with whatever it still runs."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def unprivileged_user(name: str, *, with_home: bool = False) -> Iterator[pwd.struct_passwd]:
    """A new user `name` (a test skips where that cannot be made: it needs root and useradd)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("making an OS user needs root and useradd")
    made = subprocess.run(
        [
            "useradd",
            "--create-home" if with_home else "--no-create-home",
            "--shell",
            "/bin/bash" if with_home else "/usr/sbin/nologin",
            name,
        ],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.decode().strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        # userdel refuses a user that still runs something, and a test that failed may leave some.
        subprocess.run(["pkill", "-9", "-u", name], capture_output=True)
        subprocess.run(["userdel", *(["--remove"] if with_home else []), name], capture_output=True)
