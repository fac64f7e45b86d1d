"""A hook's output on its way to the operation's log: bounded in size, long lines cut, with markers.

The script writes into a pipe and the supervisor copies the pipe into the log (SPEC 9): at most
the configured number of bytes are kept, what comes beyond is counted and named in one marker
line, and a line longer than LINE_MAX_BYTES keeps its start and ends in a marker saying how much
of it was cut. Standard library only: the supervisor imports it under `python -S`.

The copy runs on a thread of the supervisor, so that the supervisor's wait for the script and its
signals stays as it is. A setup may leave processes running (a dev server) that still hold the
pipe: their output is copied, within the same bound, for as long as they live, so that they never
write into a closed pipe; the supervisor asks for what is in the pipe at the moment its script
ended (`drain`) before it records the outcome, since the runner takes the log as complete then.

A project's secrets (SPEC 11) never reach the log: each value is replaced by `***` before the
output is bounded (`SecretMask`), here on the host, so no copy made from the log (the transcript,
`show`, the output pages) can hold one. A value split across two writes is masked too: what could
be the start of a value is held back until the next read says whether it is.
"""

from __future__ import annotations

import os
import re
import select
import threading

LINE_MAX_BYTES = 16 * 1024
MARKER_RESERVE_BYTES = 512
"""Room kept below the bound for the marker lines that say what was not kept."""
MIN_OUTPUT_MAX_BYTES = 64 * 1024
DEFAULT_OUTPUT_MAX_BYTES = 8 * 1024 * 1024
READ_CHUNK_BYTES = 1 << 16


class BoundedLog:
    """What of a stream of output is written to `fd`: see the module. Not thread-safe."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self._fd = fd
        self._budget = max_bytes - MARKER_RESERVE_BYTES
        self._kept = 0
        self._dropped = 0
        self._ends_line = True
        self._line_length = 0
        self._line_cut = 0

    def write(self, data: bytes) -> None:
        if self._kept >= self._budget:
            self._dropped += len(data)
            return
        kept = bytearray()
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            stop = len(data) if newline < 0 else newline
            room = max(LINE_MAX_BYTES - self._line_length, 0)
            kept += data[start : start + min(stop - start, room)]
            self._line_cut += max(stop - start - room, 0)
            self._line_length += stop - start
            if newline < 0:
                break
            kept += self._end_of_line()
            start = newline + 1
        self._keep(bytes(kept))

    def settle(self) -> None:
        """End a line that was cut, and say how much was not kept since the last time it was said."""
        if self._line_cut:
            self._write(self._end_of_line())
        if self._dropped:
            separator = b"" if self._ends_line else b"\n"
            self._write(
                separator
                + f"[bb: {self._dropped} bytes of output not kept: beyond "
                f"BB_HOOK_OUTPUT_MAX_BYTES ({self._budget + MARKER_RESERVE_BYTES} bytes)]\n".encode()
            )
            self._dropped = 0

    def close(self) -> None:
        os.close(self._fd)

    def _end_of_line(self) -> bytes:
        cut, self._line_cut, self._line_length = self._line_cut, 0, 0
        return f" [bb: line cut, {cut} more bytes of it not kept]\n".encode() if cut else b"\n"

    def _keep(self, data: bytes) -> None:
        room = self._budget - self._kept
        if len(data) > room:
            self._dropped += len(data) - room
            data = data[:room]
        self._kept += len(data)
        self._write(data)

    def _write(self, data: bytes) -> None:
        if data:
            os.write(self._fd, data)
            self._ends_line = data.endswith(b"\n")


MASK = b"***"


class SecretMask:
    """Replaces each of `values` in a stream of output by `***`, holding back the end of what it
    was given while that end could be the start of a value. Not thread-safe."""

    def __init__(self, values: list[bytes]) -> None:
        kept = sorted({value for value in values if value}, key=len, reverse=True)  # the longest wins
        self._values = kept
        self._pattern = re.compile(b"|".join(re.escape(value) for value in kept)) if kept else None
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be written now, masked."""
        if self._pattern is None:
            return data
        data = self._held + data
        masked = bytearray()
        start = 0
        for found in self._pattern.finditer(data):
            masked += data[start : found.start()] + MASK
            start = found.end()
        rest = data[start:]
        held = self._could_start_a_value(rest)
        self._held = rest[len(rest) - held :] if held else b""
        masked += rest[: len(rest) - held]
        return bytes(masked)

    def flush(self) -> bytes:
        """What was held back: the stream has ended (or its writer has), so it starts no value."""
        held, self._held = self._held, b""
        return held

    def _could_start_a_value(self, data: bytes) -> int:
        """The length of the longest end of `data` that a value starts with (shorter than that value)."""
        longest = min(len(data), len(self._values[0]) - 1)
        for length in range(longest, 0, -1):
            end = data[-length:]
            if any(value.startswith(end) for value in self._values):
                return length
        return 0


class OutputCopier:
    """Copies the read end of the script's output pipe into a BoundedLog, on a thread of its own,
    with `mask` applied."""

    def __init__(self, read_fd: int, log: BoundedLog, mask: SecretMask | None = None) -> None:
        self._read_fd = read_fd
        self._log = log
        self._mask = mask or SecretMask([])
        self._wake_read, self._wake_write = os.pipe()
        self._drained = threading.Event()
        self._closing = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._copy, name="hook-output", daemon=True)
        self._thread.start()

    def drain(self) -> None:
        """Return once what the pipe holds now is in the log, with the markers for what was not kept."""
        with self._closing:
            if not self._closed:  # else the copy has ended, the log settled
                os.write(self._wake_write, b"\0")
        self._drained.wait()

    def follow_to_end(self) -> None:
        """Copy until no process holds the pipe any more."""
        self._thread.join()

    def _copy(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _events in poller.poll()}
                if self._read_fd in ready and not self._copy_chunk():
                    return
                if self._wake_read in ready:
                    os.read(self._wake_read, 64)
                    self._drain_now()
        finally:
            self._log.write(self._mask.flush())
            self._log.settle()
            self._log.close()
            with self._closing:
                self._closed = True
                for fd in (self._read_fd, self._wake_read, self._wake_write):
                    os.close(fd)
            self._drained.set()

    def _drain_now(self) -> None:
        os.set_blocking(self._read_fd, False)
        try:
            while self._copy_chunk():
                pass
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(self._read_fd, True)
        # The script has ended: what it wrote last is in the log now, the outcome comes next.
        self._log.write(self._mask.flush())
        self._log.settle()
        self._drained.set()

    def _copy_chunk(self) -> bool:
        """Copy one read's worth; False at end of file."""
        data = os.read(self._read_fd, READ_CHUNK_BYTES)
        if not data:
            return False
        self._log.write(self._mask.feed(data))
        return True
