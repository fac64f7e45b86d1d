"""The runner's side of the hook launcher (see launcher, the server; protocol, all they say).

Supervisors are forked by a launcher, one long-lived helper process per runner that has imported
the supervisor once (a fresh interpreter per hook would cost about a hundred milliseconds), ahead
of need: the runner gives a hook's request to the spare the launcher announced, directly, so a
start makes no round trip through the launcher. The launcher is started on first use, restarted if
it died, and exits when the runner closes, is collected or dies.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bb_environments.hooks.protocol import FrameReader, LauncherGone, SupervisorRequest, pass_request, send_frame
from bb_environments.hooks.supervisor_watch import SupervisorHandle
from bb_environments.providers.host.withheld import without_secrets

LAUNCHER_EXIT_WAIT_S = 2.0
# Without site-packages (-S) the installed package is not importable as such: the bootstrap makes
# the directory holding `hooks` (and the `providers/host` it imports) the one directory of the
# `bb_environments` namespace, which is the source tree in a development install and
# site-packages/bb_environments in a wheel install.
LAUNCHER_BOOTSTRAP = (
    "import sys, types; package = types.ModuleType('bb_environments'); package.__path__ = [sys.argv.pop(1)]; "
    "sys.modules['bb_environments'] = package; "
    "from bb_environments.hooks.launcher import serve_launcher; serve_launcher(int(sys.argv[1]))"
)
IMPORT_ROOT = Path(__file__).resolve().parents[1]


class LauncherClient:
    """This runner's side of the supervisor launcher (see launcher).

    Thread-safe; started on first use and started again if it died. Its channel is the only
    thing that keeps it running: closing it (or this process dying) makes it exit at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channel: socket.socket | None = None
        self._frames: FrameReader | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    def ensure_started(self) -> None:
        with self._lock:
            self._forget_if_forked()
            if self._channel is None:
                self._spawn()

    def start_supervisor(self, asked: SupervisorRequest) -> SupervisorHandle:
        """Give the request to the launcher's spare, which becomes its supervisor and waits for adoption."""
        request = asked.encode()
        with self._lock:
            self._forget_if_forked()
            done, done_writer = os.pipe()
            try:
                pid, started_at, pidfd, assignment = self._take_spare()
                try:
                    pass_request(assignment, request, done_writer)
                except OSError:
                    pass  # it died just now: the caller sees it exit without an outcome, as any supervisor's death
            except BaseException:
                os.close(done)
                raise
            finally:
                os.close(done_writer)
            self._tell({"taken": pid})
        return SupervisorHandle(pid, started_at, pidfd, done)

    def _take_spare(self) -> tuple[int, int | None, int, socket.socket]:
        """The spare the launcher announced, alive: pid, start time, pidfd, and its socket.

        A launcher found gone is started again, once.
        """
        restarted = False
        while True:
            if self._frames is None:
                self._spawn()
            assert self._frames is not None
            try:
                announced, fds = self._frames.next()
            except (OSError, LauncherGone):
                self._stop()
                if restarted:
                    raise
                restarted = True
                continue
            if "error" in announced:
                self._tell({"taken": None})  # the next start asks for another try
                raise OSError(announced["error"])
            pidfd, assignment = fds
            if not _has_exited(pidfd):
                return announced["pid"], announced["started_at"], pidfd, socket.socket(fileno=assignment)
            # It died idle: the launcher announces another in its place.
            os.close(pidfd)
            os.close(assignment)

    def _tell(self, document: dict[str, Any]) -> None:
        """Send the launcher a frame. One that is gone is replaced at once, so that a spare is
        ready for the next hook; if that fails too, the next hook starts one."""
        assert self._channel is not None
        try:
            send_frame(self._channel, document)
        except OSError:
            self._stop()
            with contextlib.suppress(OSError):
                self._spawn()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # -I -S: no site-packages, no user paths; the launcher needs only the standard library.
            # Popen, not asyncio's subprocess, whose transport kills a child still running when it
            # is closed or collected.
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", LAUNCHER_BOOTSTRAP, str(IMPORT_ROOT), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                cwd=IMPORT_ROOT,
                # Its supervisors are forked from it, and a hook can read its parent's environment
                # (/proc/PPID/environ): none of theirs may hold a secret either.
                env=without_secrets(os.environ),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._channel, self._frames = ours, FrameReader(ours)

    def close(self) -> None:
        with self._lock:
            self._forget_if_forked()
            self._stop()

    def _forget_if_forked(self) -> None:
        """In a forked child of the process that started the launcher, that launcher is not ours."""
        if self._owner != os.getpid():
            if self._channel is not None:
                self._channel.close()  # our copy only
            if self._frames is not None:
                self._frames.close()
            self._channel, self._frames, self._process = None, None, None
            self._owner = os.getpid()

    def _stop(self) -> None:
        channel, frames, process = self._channel, self._frames, self._process
        self._channel, self._frames, self._process = None, None, None
        if frames is not None:
            frames.close()
        if channel is not None:
            # Spares announced and not yet read go with it: each exits at the end of its socket.
            channel.close()
        if process is not None:
            # It exits as soon as it sees the end of its channel.
            try:
                process.wait(LAUNCHER_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _has_exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])
