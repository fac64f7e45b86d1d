"""Files the host's state is kept in that a crash must leave whole or absent."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `bb` loads this module for every command (entrypoints/config.py), and pathlib is a tenth of one
    from pathlib import Path


def write_durably(path: Path, data: bytes) -> None:
    """`data` in `path` (mode 0600), and the name in its directory, on disk before the caller goes on:
    written beside it and renamed over it, so a crash at any point leaves the old file or the new."""
    temporary = path.with_name(f".{path.name}.tmp")
    # One a kill left keeps the mode it was made with: made anew, it gets 0600 whatever it had.
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    _sync_directory(path.parent)


def remove_durably(path: Path) -> None:
    """`path` gone (if it was there), and its name gone from its directory on disk."""
    path.unlink(missing_ok=True)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
