"""Finding processes by their cwd or command line, and ending them (Linux /proc)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")
GRACE_SECONDS = 2.0
POLL_SECONDS = 0.05


def kill_processes_with_cwd_under(path: str) -> int:
    """SIGTERM every process whose cwd is `path` or inside it, SIGKILL survivors after ~2 s.

    Returns how many processes were signalled. Our own process is never signalled; processes
    that vanish or whose cwd we cannot read are ignored.
    """
    root = os.path.realpath(path)
    signalled = [pid for pid in _pids_with_cwd_under(root) if _send(pid, signal.SIGTERM)]
    for pid in _still_running_after(signalled, GRACE_SECONDS):
        _send(pid, signal.SIGKILL)
    return len(signalled)


def kill_and_wait(pids: Iterable[int], timeout: float = GRACE_SECONDS) -> bool:
    """SIGKILL `pids` (a process that cannot catch it does no clean-up of its own) and wait until
    each has ended; False when one still runs after `timeout` seconds."""
    return not _still_running_after([pid for pid in pids if _send(pid, signal.SIGKILL)], timeout)


def _still_running_after(pids: list[int], timeout: float) -> list[int]:
    """Those of `pids` that have not ended within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (survivors := [pid for pid in pids if _is_running(pid)]) and time.monotonic() < deadline:
        pids = survivors
        time.sleep(POLL_SECONDS)
    return survivors


def command_lines() -> Iterator[tuple[int, list[str]]]:
    """Every other process that runs now, by pid, with its argv (kernel threads have none)."""
    own_pid = os.getpid()
    for entry in os.scandir(PROC):
        if entry.name.isdigit() and int(entry.name) != own_pid:
            arguments = command_line_of(int(entry.name))
            if arguments is not None:
                yield int(entry.name), arguments


def command_line_of(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").rstrip("\0").split("\0") if raw else None


def _pids_with_cwd_under(root: str) -> list[int]:
    own_pid = os.getpid()
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root.rstrip("/") + "/"):
            pids.append(int(entry.name))
    return pids


def _send(pid: int, signal_number: int) -> bool:
    try:
        os.kill(pid, signal_number)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie has already exited)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")
