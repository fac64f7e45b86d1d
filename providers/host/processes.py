"""Processes on this host (Linux /proc): whether one still runs, which one it is, finding them by
cwd or command line, and ending them or their process group.

A process is identified by its pid together with its start time (field 22 of `/proc/<pid>/stat`,
in clock ticks since boot): a pid whose current start time differs is a different process, and is
never signalled.

Standard library only: the hook launcher, which runs without site-packages, imports it. Nor
pathlib or signal at import time: every `bb` command that waits on the service loads this module
for `pid_alive`, and none of them needs either (`signal` is imported where one is sent).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import signal

PROC = "/proc"
GRACE_SECONDS = 2.0
POLL_SECONDS = 0.05
GROUP_EXIT_POLL_S = 0.025
GROUP_EXIT_WAIT_S = 4.0


def pid_alive(pid: int) -> bool:
    """Whether a process runs as `pid`. A zombie does not: it has ended and will never answer,
    though its parent has not reaped it yet (a test's, say, or a supervisor's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user
    try:
        return _running(_read_stat(pid))
    except OSError:
        return True  # without /proc, or with this pid hidden in it, the signal's answer stands


def process_start_ticks(pid: int) -> int | None:
    """The start time of a running (non-zombie) process, or None when it is gone."""
    fields = _stat_fields(pid)
    if fields is None or not _running(fields):
        return None
    return int(fields[19])


def start_ticks_of_child(pid: int) -> int | None:
    """The start time of an unreaped child, even one that already exited (a zombie).

    Only its parent can ask this safely: until the parent reaps it, the pid cannot be reused.
    """
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def is_same_process(pid: int | None, started_at: int | None) -> bool:
    return pid is not None and started_at is not None and process_start_ticks(pid) == started_at


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from field 3 (state) on; None if there is no such process."""
    try:
        return _read_stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None


def _read_stat(pid: int) -> list[str]:
    with open(f"{PROC}/{pid}/stat") as stat:
        text = stat.read()
    # The command name (field 2) may contain spaces and parentheses; it ends at the last ')'.
    return text[text.rindex(")") + 2 :].split()


def _running(fields: list[str]) -> bool:
    """Not a zombie (nor dead): such a process has exited, whoever has not reaped it yet."""
    return fields[0] not in ("Z", "X")


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
        with open(f"{PROC}/{pid}/cmdline", "rb") as cmdline:
            raw = cmdline.read()
    except OSError:
        return None
    return raw.decode(errors="replace").rstrip("\0").split("\0") if raw else None


def kill_processes_with_cwd_under(path: str) -> int:
    """SIGTERM every process whose cwd is `path` or inside it, SIGKILL survivors after ~2 s.

    Returns how many processes were signalled. Our own process is never signalled; processes
    that vanish or whose cwd we cannot read are ignored.
    """
    import signal

    root = os.path.realpath(path)
    signalled = [pid for pid in _pids_with_cwd_under(root) if _send(pid, signal.SIGTERM)]
    for pid in _still_running_after(signalled, GRACE_SECONDS):
        _send(pid, signal.SIGKILL)
    return len(signalled)


def kill_and_wait(pids: Iterable[int], timeout: float = GRACE_SECONDS) -> bool:
    """SIGKILL `pids` (a process that cannot catch it does no clean-up of its own) and wait until
    each has ended; False when one still runs after `timeout` seconds."""
    import signal

    return not _still_running_after([pid for pid in pids if _send(pid, signal.SIGKILL)], timeout)


def _still_running_after(pids: list[int], timeout: float) -> list[int]:
    """Those of `pids` that have not ended within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (survivors := [pid for pid in pids if pid_alive(pid)]) and time.monotonic() < deadline:
        pids = survivors
        time.sleep(POLL_SECONDS)
    return survivors


def _pids_with_cwd_under(root: str) -> list[int]:
    own_pid = os.getpid()
    pids = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        try:
            cwd = os.readlink(f"{entry.path}/cwd")
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


def group_has_live_members(pgid: int) -> bool:
    # Scans /proc instead of `killpg(pgid, 0)`: zombies still count for killpg, and a container
    # whose init never reaps orphans would keep a dead group "alive" forever.
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and _running(fields) and int(fields[2]) == pgid:
            return True
    return False


def kill_group_and_wait(pgid: int, wait_s: float = GROUP_EXIT_WAIT_S) -> bool:
    """SIGKILL a process group and wait until no live member remains; True if confirmed gone."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + wait_s
    while group_has_live_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_EXIT_POLL_S)
    return True


def kill_recorded_group(leader_pid: int | None, leader_started_at: int | None) -> bool:
    """Kill the group a recorded process leads, never a group that a reused pid now leads.

    True when the group is confirmed gone (or never existed).
    """
    if leader_pid is None:
        return True
    if process_start_ticks(leader_pid) is not None:
        if not is_same_process(leader_pid, leader_started_at):
            return True
        return kill_group_and_wait(leader_pid)
    # The leader is gone but members may linger. While any member lives, the kernel keeps the
    # group id allocated, so no new process can have taken that pid: the group is still ours.
    if group_has_live_members(leader_pid):
        return kill_group_and_wait(leader_pid)
    return True


def signal_recorded_process(pid: int | None, started_at: int | None, signal_number: signal.Signals) -> bool:
    """Signal `pid` only if it is still the recorded process; True if the signal was sent."""
    import signal

    if pid is None or started_at is None:
        return False
    try:
        # The pidfd pins the process that holds `pid` now, so the identity check below cannot be
        # outdated by the time the signal is sent.
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if process_start_ticks(pid) != started_at:
            return False
        signal.pidfd_send_signal(descriptor, signal_number)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(descriptor)
