"""An exclusive lock on a file that says who holds it.

The lock is a flock: the kernel drops it when the last descriptor of it closes, so it dies with
its holder (SIGKILL included) and never goes stale, and a child that inherits the descriptor keeps
it held after its parent is gone. The file records its holder as JSON, so that a process refused
the lock can name who has it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TypeVar

import msgspec

Record = TypeVar("Record")
_LONGEST_RECORD = 4096


class FileLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def fileno(self) -> int:
        return self._descriptor

    def acquire(self) -> bool:
        """Take the lock unless another open of the file holds it (one a child inherited from us does not)."""
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def record(self, holder: msgspec.Struct) -> None:
        data = msgspec.json.encode(holder)
        # Over the old record, then cut to length: a reader never finds the file empty in between.
        os.pwrite(self._descriptor, data, 0)
        os.ftruncate(self._descriptor, len(data))

    def holder(self, kind: type[Record]) -> Record | None:
        """The holder's record, or None when it has not written one that reads as `kind`."""
        return read_holder(self.path, kind)

    def close(self) -> None:
        os.close(self._descriptor)


def read_holder(path: Path, kind: type[Record]) -> Record | None:
    """The record in a lock file, read without opening it for writing (nor creating it)."""
    try:
        with open(path, "rb") as file:
            return msgspec.json.decode(file.read(_LONGEST_RECORD), type=kind)
    except (OSError, msgspec.DecodeError):
        return None
