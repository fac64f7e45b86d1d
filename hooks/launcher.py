"""The launcher: forks hook supervisors for one runner, so no hook waits for a Python to start.

One per HookRunner, started with `python -I -S` and the channel (a Unix stream socket, see
protocol) as an inherited descriptor. Single-threaded, so forking it is safe. Standard library
only, like all it imports.

To keep the fork (and the child's first page faults) out of a hook's latency, the launcher keeps
one child forked ahead of need, the spare, and announces it to the runner: its pid, start time,
pidfd and the socket on which it waits for its request. The runner gives the request to the spare
itself, so a hook start does not wait for this process; it tells the launcher it took the spare,
and the launcher forks and announces the next one. A spare that dies before it is taken is
replaced the same way (the runner skips the announcement of a dead one). The spare is in its own
session already and becomes its request's supervisor; a socket closed without a request makes it
exit. It is born with the supervisor's signals blocked, and discards a SIGTERM that is pending
when its request arrives: that one was meant for an idle spare, not a cancel, which only signals
an adopted supervisor and writes its tombstone first, before this process can be adopted and look
for the tombstone.

The launcher reaps its children and exits at once when the channel reaches end of file, which is
what a closed, collected or dead runner leaves behind; supervisors live on, and a spare whose
socket only that runner held exits.
"""

from __future__ import annotations

import os
import select
import signal
import socket

from bb_environments.hooks import supervisor
from bb_environments.hooks.protocol import FrameReader, SupervisorRequest, receive_request, send_frame
from bb_environments.providers.host.processes import start_ticks_of_child


def serve_launcher(channel_fd: int) -> None:
    try:
        _serve(channel_fd)
    finally:
        # Whatever ended the loop, exit without the interpreter's clean-up: nothing to flush.
        os._exit(0)


def _serve(channel_fd: int) -> None:
    channel = socket.socket(fileno=channel_fd)
    frames = FrameReader(channel)
    poller = select.poll()
    poller.register(channel_fd, select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid, until reaped
    spare: int | None = None  # the pid of the spare announced and not yet taken
    wanted = True  # a spare is to be announced; after a failed fork, only once the runner asks again
    while True:
        if spare is None and wanted:
            try:
                spare, pidfd, assignment = _fork_spare(channel, children, poller)
            except OSError as error:
                send_frame(channel, {"error": f"could not start a hook supervisor: {error}"})
                wanted = False
            else:
                with assignment:
                    # The runner's copy of the spare's socket is then the only one.
                    send_frame(
                        channel, {"pid": spare, "started_at": start_ticks_of_child(spare)}, [pidfd, assignment.fileno()]
                    )
        # The channel first: a spare the runner took and that already finished its hook is not
        # one that died idle, to be replaced a second time.
        for fd, _events in sorted(poller.poll(), key=lambda ready: ready[0] != channel_fd):
            if fd == channel_fd:
                if not frames.receive():
                    return
                while (frame := frames.take()) is not None:
                    if frame[0].get("taken") == spare:
                        spare = None
                    wanted = True
                continue
            poller.unregister(fd)
            pid = children.pop(fd)
            os.waitpid(pid, 0)
            os.close(fd)
            if pid == spare:
                spare = None


def _fork_spare(
    channel: socket.socket, children: dict[int, int], poller: select.poll
) -> tuple[int, int, socket.socket]:
    """Fork a spare: its pid, its pidfd and the socket on which it waits for its request."""
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
    return pid, pidfd, ours


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
            # The done pipe is closed right after the last record write: the runner learns it
            # then, not once the output of what the hook left running has ended.
            supervisor.main(
                [asked.records_dir, asked.operation_id, asked.timeout, asked.sync, asked.output_max_bytes],
                asked.environment,
                tuple(fds),
                cgroups=asked.cgroups,
                run_as=asked.run_as,
                git_hook=asked.git_hook,
                masked=asked.masked,
            )
        else:
            for fd in fds:
                os.close(fd)
        status = 0
    finally:
        os._exit(status)
