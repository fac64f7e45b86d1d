"""Deleting workspaces on the host: path keys that stay one segment, removals that never leave
their root, processes that are stopped first, trees that always go."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from bb_environments.providers.contract import Reporter
from bb_environments.providers.host.processes import kill_processes_with_cwd_under

PATH_KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def require_path_key(path_key: str) -> str:
    """A path key becomes one directory name: never a separator, `..` or a leading dash."""
    if not PATH_KEY_PATTERN.fullmatch(path_key):
        raise ValueError(f"path key {path_key!r} must be a single path segment of [A-Za-z0-9._-]")
    return path_key


def is_strictly_inside(path: Path, root: Path) -> bool:
    """`path` lies below `root` once symlinks and `..` are resolved: what a removal may touch."""
    return Path(os.path.realpath(root)) in Path(os.path.realpath(path)).parents


def stop_processes_in(path: Path, report: Reporter, place: str) -> None:
    """End what still runs in `path` before it is deleted, and say so in the transcript."""
    killed = kill_processes_with_cwd_under(str(path))
    if killed:
        report.log(f"Stopped {killed} process(es) running in the {place}")


def delete_tree(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    shutil.rmtree(path, onerror=_retry_after_making_writable)


def _retry_after_making_writable(function: Callable[[str], object], failed_path: str, _exc_info: object) -> None:
    """Read-only directories (a Go module cache, say) must not make removal fail."""
    os.chmod(os.path.dirname(failed_path), stat.S_IRWXU)
    if os.path.isdir(failed_path) and not os.path.islink(failed_path):
        os.chmod(failed_path, stat.S_IRWXU)
    function(failed_path)


def remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno != errno.ENOTEMPTY:  # something else lives there: leave it
            raise
