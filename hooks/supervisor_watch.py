"""A hook's supervisor as the runner follows it: its pidfd (which turns readable when it exits),
and for one the runner started, the pipe it closes right after its last record write. So the
runner learns that a supervisor is done, or died, without polling; only one it can get no pidfd
for has its liveness polled (`supervisor_alive`)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from bb_environments.hooks.records import HookRecord
from bb_environments.providers.host.processes import is_same_process


def supervisor_alive(record: HookRecord) -> bool:
    return is_same_process(record.supervisor_pid, record.supervisor_started_at)


def open_supervisor_pidfd(record: HookRecord) -> int | None:
    """A pidfd of the record's supervisor if that very process still runs, else None."""
    if record.supervisor_pid is None:
        return None
    try:
        pidfd = os.pidfd_open(record.supervisor_pid)
    except OSError:
        return None
    # Checked after opening: the pidfd pins whichever process held the pid at that moment.
    if is_same_process(record.supervisor_pid, record.supervisor_started_at):
        return pidfd
    os.close(pidfd)
    return None


@dataclass
class SupervisorHandle:
    """A supervisor process as this process holds it: pidfd, and for one we started, `done`."""

    pid: int
    started_at: int | None
    pidfd: int
    # The read end of a pipe whose only writer the supervisor closes right after writing its
    # outcome (or dies): it tells us before its exit does, which waits for its memory to be freed.
    done: int | None = None

    def close(self) -> None:
        os.close(self.pidfd)
        if self.done is not None:
            os.close(self.done)


class SupervisorWatch:
    """A supervisor watched by the event loop: its pidfd turns readable when it has exited."""

    def __init__(self, supervisor: SupervisorHandle) -> None:
        self._supervisor = supervisor
        self._loop = asyncio.get_running_loop()
        self._exited = self._watch(supervisor.pidfd)
        self._done = None if supervisor.done is None else self._watch(supervisor.done)

    def _watch(self, fd: int) -> asyncio.Future[None]:
        readable: asyncio.Future[None] = self._loop.create_future()

        def on_readable() -> None:
            self._loop.remove_reader(fd)
            if not readable.done():
                readable.set_result(None)

        self._loop.add_reader(fd, on_readable)
        return readable

    @property
    def fresh(self) -> bool:
        """Started by this process and not yet done."""
        return self._done is not None and not self._done.done()

    @property
    def exited(self) -> bool:
        return self._exited.done()

    async def wait(self, timeout_s: float) -> None:
        """Until the supervisor is done or has exited, or the time is up."""
        waiting = [self._exited] if self._done is None or self._done.done() else [self._exited, self._done]
        await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)

    def close(self) -> None:
        self._loop.remove_reader(self._supervisor.pidfd)
        if self._supervisor.done is not None:
            self._loop.remove_reader(self._supervisor.done)
        self._supervisor.close()
