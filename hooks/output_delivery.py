"""Delivering a hook's output, line by line, to the run that follows it.

Lines are delivered at most once per process, each with its byte offset in the operation's log:
this process remembers how far into an operation's log it has delivered. A process that replays or
joins an operation it has not seen before delivers the log from its start, so a consumer sees lines
again after a restart and can tell them by their offset.

Of a backlog longer than `lines_kept` (what the transcript keeps of an environment), only the
newest lines are delivered, after one line saying how many were left out: the transcript would drop
the older ones as soon as the newer came, and delivering every line of a hook that prints megabytes
kept the event loop the API answers on busy (bench/hook_output.py). The log on disk keeps them all
(`bb environment logs --hook-output`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

LINES_BETWEEN_YIELDS = 100

OutputSink = Callable[[str, int], Awaitable[None]]
"""Receives a line of output (without its newline) and the byte offset in the log where it starts."""


class OutputDelivery:
    """How far into each operation's log this process has delivered, and the delivering."""

    def __init__(self, lines_kept: int | None = None) -> None:
        self._lines_kept = lines_kept
        self._offsets: dict[str, int] = {}

    def offset(self, operation_id: str) -> int:
        """Where the next undelivered line of the operation's log starts."""
        return self._offsets.get(operation_id, 0)

    def forget(self, operation_id: str) -> None:
        self._offsets.pop(operation_id, None)

    async def deliver_log(self, operation_id: str, log_path: Path, on_output: OutputSink, complete: bool) -> None:
        """Send the lines of the log at `log_path` not delivered yet; a partial last line only once complete."""
        offset = self.offset(operation_id)
        data = await asyncio.to_thread(read_from, log_path, offset)
        await self.deliver(operation_id, data, offset, on_output, complete)

    async def deliver(self, operation_id: str, data: bytes, offset: int, on_output: OutputSink, complete: bool) -> None:
        """Send `data`, read from `offset` of the log; a partial last line only once complete."""
        if not complete:
            data = data[: data.rfind(b"\n") + 1]
        lines = data.splitlines(keepends=True)
        kept = self._lines_kept
        if kept is not None and len(lines) > kept:
            left_out, lines = lines[: len(lines) - kept + 1], lines[len(lines) - kept + 1 :]  # +1: the marker's room
            left_out_bytes = sum(map(len, left_out))
            await on_output(
                f"[bb: {len(left_out)} lines ({left_out_bytes} bytes) of output not in the transcript, "
                f"which keeps the last {kept} of an environment: bb environment logs --hook-output "
                "has them]",
                offset,
            )
            offset += left_out_bytes
            self._offsets[operation_id] = offset
        for number, line in enumerate(lines, start=1):
            start, offset = offset, offset + len(line)
            self._offsets[operation_id] = offset
            await on_output(line.rstrip(b"\r\n").decode("utf-8", errors="replace"), start)
            if number % LINES_BETWEEN_YIELDS == 0:
                # A hook printing megabytes must not hold the event loop the API answers on.
                await asyncio.sleep(0)


def read_from(path: Path, offset: int) -> bytes:
    """The file from `offset` on; nothing if there is no file (yet)."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read()
    except FileNotFoundError:
        return b""
