"""The launcher: forks hook supervisors for one runner, so no hook waits for a Python to start.

One per HookRunner, started with `python -I -S` and the channel (a Unix stream socket, see
protocol) as an inherited descriptor. Single-threaded, so forking it is safe. Standard library
only, like all it imports.

To keep the fork (and the child's first page faults) out of a hook's latency, the launcher keeps
one child forked ahead of need, the spare: in its own session already, it waits on a socket for
its request and becomes that request's supervisor. A socket closed without a request makes it
exit. It is born with the supervisor's signals blocked, and discards a SIGTERM that is pending
when its request arrives: that one was meant for an idle spare, not a cancel, which only signals
an adopted supervisor and writes its tombstone first, before this process can be adopted and look
for the tombstone.

The launcher reaps its children and exits at once when the channel reaches end of file, which is
what a closed, collected or dead runner leaves behind; supervisors live on, the spare exits.
"""

from __future__ import annotations

import os
import select
import signal
import socket

from bb_environments.hooks import supervisor
from bb_environments.hooks.protocol import (
    MAX_FDS_PER_RECEIVE,
    SupervisorRequest,
    pass_request,
    receive_request,
    send_frame,
    take_frame,
)
from bb_environments.hooks.records import start_ticks_of_child


class _Spare:
    __slots__ = ("pid", "pidfd", "started_at", "assignment")

    def __init__(self, pid: int, pidfd: int, started_at: int | None, assignment: socket.socket) -> None:
        self.pid, self.pidfd, self.started_at, self.assignment = pid, pidfd, started_at, assignment


def serve_launcher(channel_fd: int) -> None:
    try:
        _serve(channel_fd)
    finally:
        # Whatever ended the loop, exit without the interpreter's clean-up: nothing to flush.
        os._exit(0)


def _serve(channel_fd: int) -> None:
    channel = socket.socket(fileno=channel_fd)
    poller = select.poll()
    poller.register(channel_fd, select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid, until reaped
    spare: _Spare | None = None
    received = bytearray()
    received_fds: list[int] = []  # each arrives with the first byte of its request
    while True:
        if spare is None:
            try:
                spare = _fork_spare(channel, children, poller)
            except OSError:
                pass  # tried again for the next request, which reports the error
        for fd, _events in poller.poll():
            if fd != channel_fd:
                poller.unregister(fd)
                os.waitpid(children.pop(fd), 0)
                os.close(fd)
                if spare is not None and spare.pidfd == fd:
                    spare.assignment.close()
                    spare = None
                continue
            chunk, fds, _flags, _address = socket.recv_fds(
                channel, 1 << 16, MAX_FDS_PER_RECEIVE, socket.MSG_CMSG_CLOEXEC
            )
            received_fds += fds
            if not chunk:
                return
            received += chunk
            while (request := take_frame(received)) is not None:
                done = received_fds.pop(0) if received_fds else None
                try:
                    _hand_over(channel, request, done, spare, children, poller)
                finally:
                    if done is not None:
                        os.close(done)
                spare = None  # given away, or dead


def _hand_over(
    channel: socket.socket,
    request: bytes,
    done: int | None,
    spare: _Spare | None,
    children: dict[int, int],
    poller: select.poll,
) -> None:
    """Tell the runner which process supervises its request, then give that process the request.

    The runner hears first: it has a record to write before the supervisor can do anything.
    """
    if spare is not None and _has_exited(spare.pidfd):
        spare.assignment.close()  # the pidfd is the poller's, to reap it
        spare = None
    if spare is None:
        try:
            spare = _fork_spare(channel, children, poller)
        except OSError as error:
            send_frame(channel, {"error": f"could not start a hook supervisor: {error}"})
            return
    send_frame(channel, {"pid": spare.pid, "started_at": spare.started_at}, [spare.pidfd])
    try:
        pass_request(spare.assignment, request, done)
    except OSError:
        pass  # it died just now: the runner sees it exit without an outcome, as any supervisor's death


def _has_exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def _fork_spare(channel: socket.socket, children: dict[int, int], poller: select.poll) -> _Spare:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Blocked from birth: no moment in which a SIGTERM kills the supervisor instead of cancelling.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, supervisor.BLOCKED_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        ours.close()
        theirs.close()
        raise
    if pid == 0:
        ours.detach()
        _be_spare(channel, theirs)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    theirs.close()
    # Until we reap it the pid is the child's, so the pidfd and the start time are its own.
    pidfd = os.pidfd_open(pid)
    children[pidfd] = pid
    poller.register(pidfd, select.POLLIN)
    return _Spare(pid, pidfd, start_ticks_of_child(pid), ours)


def _be_spare(channel: socket.socket, assignment: socket.socket) -> None:
    """In the forked child: wait for a request, supervise it, exit without the launcher's clean-up."""
    status = 1
    try:
        channel.detach()
        # The launcher's channel, its other children's pidfds and sockets are not the supervisor's.
        keep = assignment.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        os.setsid()
        request, fds = receive_request(assignment)
        assignment.close()
        signal.sigtimedwait({signal.SIGTERM}, 0)  # see above: not a cancel
        if request:
            asked = SupervisorRequest.decode(request)
            supervisor.main([asked.records_dir, asked.operation_id, asked.timeout, asked.sync], asked.environment)
        # Right after the last record write: the runner learns it now, not once this process
        # has been torn down.
        for fd in fds:
            os.close(fd)
        status = 0
    finally:
        os._exit(status)
