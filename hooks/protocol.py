"""The one protocol between the hook processes: the runner (in the service), its launcher, a supervisor.

Standard library only: the launcher runs under `python -I -S` and imports this.

Runner and launcher talk over the launcher's channel, a Unix stream socket the runner hands it at
start. Frames both ways are a 4-byte big-endian length and a JSON document:
  request  a `SupervisorRequest`, with the write end of the runner's "done" pipe attached: the
           supervisor closes it right after its last record write
  reply    {"pid", "started_at"} with a pidfd of the supervisor attached, or {"error"}
The launcher exits as soon as the channel reaches end of file.

The launcher gives a request to a forked child of its own (its spare, see launcher) on that
child's socket: the request's JSON document, unframed, with the done pipe attached, and then end
of file. End of file without a request makes the spare exit.

Runner and supervisor talk through the operation's record (see records): the runner writes the
record naming the supervisor (its adoption) and sends ADOPTED_SIGNAL as a wake-up; SIGTERM to an
adopted supervisor cancels the hook. A supervisor that cannot write its outcome hands it out on
the operation's outcome address (records.HeldOutcome).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from dataclasses import asdict, dataclass
from typing import Any

FRAME_HEADER = struct.Struct(">I")
MAX_FDS_PER_RECEIVE = 16
# The runner's "the record now names you": only a wake-up, the record stays the truth.
ADOPTED_SIGNAL = signal.SIGUSR1


class LauncherGone(Exception):
    """The launcher's end of the channel closed: it exited."""


@dataclass(frozen=True)
class SupervisorRequest:
    records_dir: str
    operation_id: str
    timeout: str
    sync: str
    environment: dict[str, str]
    """The environment of the moment the hook was asked for, as a freshly spawned supervisor would have had."""

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def decode(cls, data: bytes) -> SupervisorRequest:
        return cls(**json.loads(data))


def send_frame(channel: socket.socket, document: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(document).encode()
    frame = FRAME_HEADER.pack(len(data)) + data
    # The descriptors travel with the frame's first byte, which is how the receiver pairs them.
    if fds:
        sent = socket.send_fds(channel, [frame], fds, socket.MSG_NOSIGNAL)
    else:
        sent = channel.send(frame, socket.MSG_NOSIGNAL)
    channel.sendall(frame[sent:], socket.MSG_NOSIGNAL)


def take_frame(received: bytearray) -> bytes | None:
    """The first whole frame's document, removed from `received`; None while it is incomplete."""
    if len(received) < FRAME_HEADER.size:
        return None
    end = FRAME_HEADER.size + FRAME_HEADER.unpack_from(received)[0]
    if len(received) < end:
        return None
    frame = bytes(received[FRAME_HEADER.size : end])
    del received[:end]
    return frame


def receive_frame(channel: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One frame's document and the descriptors that came with it; blocking."""
    received = bytearray()
    fds: list[int] = []
    try:
        while (frame := take_frame(received)) is None:
            data, more_fds, _flags, _address = socket.recv_fds(channel, 1 << 16, 1, socket.MSG_CMSG_CLOEXEC)
            fds += more_fds
            if not data:
                raise LauncherGone("the hook launcher exited")
            received += data
        return json.loads(frame), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def pass_request(assignment: socket.socket, request: bytes, done: int | None) -> None:
    """Give a spare its request, then end its socket."""
    try:
        sent = socket.send_fds(assignment, [request], [] if done is None else [done])
        assignment.sendall(request[sent:])
    finally:
        assignment.close()


def receive_request(assignment: socket.socket) -> tuple[bytes, list[int]]:
    """A spare's request (empty if there is none) and the descriptors that came with it."""
    chunks: list[bytes] = []
    fds: list[int] = []
    while True:
        chunk, more_fds, _flags, _address = socket.recv_fds(
            assignment, 1 << 16, MAX_FDS_PER_RECEIVE, socket.MSG_CMSG_CLOEXEC
        )
        fds += more_fds
        if not chunk:
            return b"".join(chunks), fds
        chunks.append(chunk)
