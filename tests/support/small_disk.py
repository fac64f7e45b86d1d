"""A small tmpfs that a test fills up, so that real writes to it fail with ENOSPC, and then frees."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FILL_CHUNK = 1 << 16


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._filler = path / "filler"

    def fill(self) -> None:
        """Take every free block: from now on a write that needs one fails with ENOSPC."""
        descriptor = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Big chunks first, then bytes: no block may be left even partly free.
            for chunk in (FILL_CHUNK, 1):
                try:
                    while True:
                        os.write(descriptor, b"\0" * chunk)
                except OSError as full:
                    if full.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(descriptor)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@contextmanager
def small_disk(path: Path, size_mib: int = 16) -> Iterator[SmallDisk]:
    """A tmpfs mounted at `path` for the duration; the test is skipped where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        refusal = mounted.stderr.strip() if mounted.returncode else None
    except FileNotFoundError:
        refusal = "no mount command"
    if refusal is not None:
        pytest.skip(f"a full disk is simulated with a tmpfs, which cannot be mounted here: {refusal}")
    disk = SmallDisk(path)
    try:
        yield disk
    finally:
        # A test that failed midway must not leave a process of it retrying writes forever.
        disk.free()
        # Lazy: a process the test started may still hold a file there for a moment.
        subprocess.run(["umount", "--lazy", str(path)], check=True)
