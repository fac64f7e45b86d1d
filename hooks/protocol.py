"""The one protocol between the hook processes: the runner (in the service), its launcher, a supervisor.

Standard library only: the launcher runs under `python -I -S` and imports this.

Runner and launcher talk over the launcher's channel, a Unix stream socket the runner hands it at
start. Frames both ways are a header (a 4-byte big-endian length and a byte counting the
descriptors attached to the frame's first byte) and a JSON document:
  launcher  {"pid", "started_at"} announces a spare (see launcher), with its pidfd and its
            assignment socket attached; or {"error"} when none could be forked
  runner    {"taken": pid} the announced spare is the runner's now (or {"taken": null} after an
            error): announce another
The launcher announces one spare at a time, a new one once the last is taken or has died. The
launcher exits as soon as the channel reaches end of file.

The runner gives its request to the spare itself, on the spare's assignment socket: the request's
JSON document, unframed, with the write end of the runner's "done" pipe attached (the supervisor
closes it right after its last record write), and then end of file. So no hook start waits for
the launcher. End of file without a request makes the spare exit: the runner closed it, or died.

Runner and supervisor talk through the operation's record (see records): the runner writes the
record naming the supervisor (its adoption) and sends ADOPTED_SIGNAL as a wake-up; SIGTERM to an
adopted supervisor cancels the hook. A supervisor that cannot write its outcome hands it out on
the operation's outcome address (records.HeldOutcome).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from bb_environments.providers.host.workspace_user import WorkspaceUser

FRAME_HEADER = struct.Struct(">IB")  # the document's length, the descriptors attached
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
    output_max_bytes: str
    """How much of the script's output its log keeps (BB_HOOK_OUTPUT_MAX_BYTES, see output_log)."""
    cgroups: list[str] = field(default_factory=list)
    """The cgroups the script is to run in, one per hierarchy (providers/host/containment.py);
    none: the supervisor's own."""
    run_as: WorkspaceUser | None = None
    """The user the script runs as (BB_WORKSPACE_USER); None: the supervisor's own."""
    git_hook: list[str] | None = None
    """The repository's git hook to run before the script, as its command (BB_GIT_HOOKS=run:
    the post-checkout hook the workspace's checkout owes, see providers/git_commands.py)."""
    masked: list[str] = field(default_factory=list)
    """The variables of `environment` whose values the log shows as `***`: the project's secrets."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> SupervisorRequest:
        document = json.loads(data)
        run_as = document.pop("run_as", None)
        user = None if run_as is None else WorkspaceUser(**{**run_as, "groups": tuple(run_as["groups"])})
        return cls(**document, run_as=user)


def send_frame(channel: socket.socket, document: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(document).encode()
    frame = FRAME_HEADER.pack(len(data), len(fds or ())) + data
    # The descriptors travel with the frame's first byte, which is how the receiver pairs them.
    if fds:
        sent = socket.send_fds(channel, [frame], fds, socket.MSG_NOSIGNAL)
    else:
        sent = channel.send(frame, socket.MSG_NOSIGNAL)
    channel.sendall(frame[sent:], socket.MSG_NOSIGNAL)


class FrameReader:
    """The frames arriving on a channel, each with the descriptors sent with it; blocking.

    A read may bring in parts of several frames and their descriptors: what follows the frame
    taken is kept for the next one.
    """

    def __init__(self, channel: socket.socket) -> None:
        self._channel = channel
        self._received = bytearray()
        self._fds: list[int] = []

    def next(self) -> tuple[dict[str, Any], list[int]]:
        """The next frame's document and descriptors; LauncherGone at the channel's end."""
        while (frame := self.take()) is None:
            if not self.receive():
                raise LauncherGone("the hook launcher exited")
        return frame

    def receive(self) -> bool:
        """Read what has arrived, waiting for something; False at the channel's end."""
        data, fds = _receive_with_fds(self._channel)
        self._fds += fds
        self._received += data
        return bool(data)

    def take(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next frame if it has arrived whole, without reading."""
        if len(self._received) < FRAME_HEADER.size:
            return None
        length, attached = FRAME_HEADER.unpack_from(self._received)
        end = FRAME_HEADER.size + length
        if len(self._received) < end:
            return None
        document = json.loads(bytes(self._received[FRAME_HEADER.size : end]))
        del self._received[:end]
        fds, self._fds = self._fds[:attached], self._fds[attached:]
        return document, fds

    def close(self) -> None:
        """Close the descriptors received and not taken."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def pass_request(assignment: socket.socket, request: bytes, done: int) -> None:
    """Give a spare its request and the write end of the done pipe, then end its socket."""
    try:
        sent = socket.send_fds(assignment, [request], [done])
        assignment.sendall(request[sent:])
    finally:
        assignment.close()


def receive_request(assignment: socket.socket) -> tuple[bytes, list[int]]:
    """A spare's request (empty if there is none) and the descriptors that came with it."""
    chunks: list[bytes] = []
    fds: list[int] = []
    while True:
        chunk, more_fds = _receive_with_fds(assignment)
        fds += more_fds
        if not chunk:
            return b"".join(chunks), fds
        chunks.append(chunk)


def _receive_with_fds(channel: socket.socket) -> tuple[bytes, list[int]]:
    """What socket.recv_fds returns, with each descriptor close-on-exec from the moment it arrives.

    recv_fds itself drops its flags argument (CPython 3.11), so MSG_CMSG_CLOEXEC never reached the
    kernel and every hook inherited the done pipe's write end: a daemon a setup script left behind
    held it open. Set afterwards instead, a fork on another thread could still slip in between.
    """
    fds = array.array("i")
    data, ancillary, _flags, _address = channel.recvmsg(
        1 << 16, socket.CMSG_LEN(MAX_FDS_PER_RECEIVE * fds.itemsize), socket.MSG_CMSG_CLOEXEC
    )
    for level, kind, payload in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)
