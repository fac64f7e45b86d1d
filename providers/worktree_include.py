"""Copying the untracked files a repo lists in `.worktreeinclude` into a new worktree.

The include file uses gitignore syntax and git's own matcher picks the files, so directories,
`**` and negation behave exactly as in `.gitignore`. Copying never overwrites anything and never
follows a symlink, in the source or planted in the worktree.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from bb_environments.providers.git_commands import WITHOUT_REPOSITORY_HOOKS, git_environment

INCLUDE_FILE_NAME = ".worktreeinclude"
COPY_CHUNK_BYTES = 1 << 20


@dataclass
class IncludeReport:
    copied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) for every matching file that was not copied."""
    error: str | None = None
    """Why nothing could be matched (unreadable include file, failing `git ls-files`)."""


class _Skip(Exception):
    """A file is left out; the message is the reason shown to the user."""


def copy_worktree_includes(source: Path, target: Path, cancelled: threading.Event) -> IncludeReport:
    report = IncludeReport()
    include_file = source / INCLUDE_FILE_NAME
    try:
        if not include_file.is_file() or not _has_patterns(include_file.read_text(errors="replace")):
            return report
        relative_paths = _matching_untracked_files(source, include_file)
    except (OSError, subprocess.CalledProcessError) as error:
        report.error = _describe(error)
        return report
    real_target = Path(os.path.realpath(target))
    for relative_path in relative_paths:
        if cancelled.is_set():
            break
        try:
            _copy_one(source / relative_path, target / relative_path, real_target)
        except _Skip as skip:
            report.skipped.append((relative_path, str(skip)))
        except OSError as error:
            report.skipped.append((relative_path, error.strerror or str(error)))
        else:
            report.copied.append(relative_path)
    return report


def _has_patterns(text: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines())


def _matching_untracked_files(source: Path, include_file: Path) -> list[str]:
    completed = subprocess.run(
        ["git", *WITHOUT_REPOSITORY_HOOKS, "ls-files", "--others", "--ignored", f"--exclude-from={include_file}", "-z"],
        cwd=source,
        env=git_environment(),
        capture_output=True,
        check=True,
        timeout=60,
    )
    return [name for name in completed.stdout.decode(errors="surrogateescape").split("\0") if name]


def _describe(error: OSError | subprocess.CalledProcessError) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        stderr = error.stderr.decode(errors="replace").strip().splitlines()
        return f"git ls-files failed: {stderr[-1] if stderr else f'exit status {error.returncode}'}"
    return f"{INCLUDE_FILE_NAME}: {error.strerror or error}"


def _copy_one(source_file: Path, destination: Path, real_target: Path) -> None:
    source_stat = os.lstat(source_file)
    if stat.S_ISLNK(source_stat.st_mode):
        raise _Skip("symlink")
    if not stat.S_ISREG(source_stat.st_mode):
        raise _Skip("not a regular file")
    _refuse_escape(destination.parent, real_target)
    if os.path.lexists(destination):
        raise _Skip("already exists in the worktree")
    destination.parent.mkdir(parents=True, exist_ok=True)
    # Re-checked after mkdir: a symlink planted meanwhile must not redirect the write.
    _refuse_escape(destination.parent, real_target)
    _copy_exclusively(source_file, destination, stat.S_IMODE(source_stat.st_mode))


def _refuse_escape(directory: Path, real_target: Path) -> None:
    real_directory = Path(os.path.realpath(directory))
    if real_directory != real_target and real_target not in real_directory.parents:
        raise _Skip("destination escapes the worktree")


def _copy_exclusively(source_file: Path, destination: Path, mode: int) -> None:
    source_fd = os.open(source_file, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        destination_fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _copy_contents(source_fd, destination_fd)
            os.fchmod(destination_fd, mode)
        except OSError:
            os.unlink(destination)
            raise
        finally:
            os.close(destination_fd)
    finally:
        os.close(source_fd)


def _copy_contents(source_fd: int, destination_fd: int) -> None:
    while chunk := os.read(source_fd, COPY_CHUNK_BYTES):
        view = memoryview(chunk)
        while view:
            view = view[os.write(destination_fd, view) :]
