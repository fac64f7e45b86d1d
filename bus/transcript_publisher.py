"""Transcript lines (provider steps, hook output) go to their own size-limited stream; a host's
agent's go there through the core, which checks them first.

Publishing is fire-and-forget from any thread: progress must never block or fail a step. Lines
are sent in order; while the bus is away they wait and go out once it is back. At most
MAX_WAITING_LINES wait: beyond that the oldest are dropped, whether the bus is away or lines come
faster than they go out (a hook printing megabytes), and the log says which.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec
from nats.aio.client import Client

from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.transcript_lines import TranscriptKind, TranscriptLine

log = logging.getLogger(__name__)

MAX_WAITING_LINES = 10_000

Line = tuple[str, bytes, dict[str, str] | None]  # subject, payload, headers


class TranscriptPublisher:
    def __init__(
        self,
        nc: Client,
        loop: asyncio.AbstractEventLoop,
        *,
        health: BusHealth | None = None,
        host_id: str | None = None,
    ) -> None:
        """`host_id`: the host whose agent writes these lines, under its own subjects, for the core to
        check (bus/core/transcript_intake.py); None: the service's own lines, written where they are read."""
        self._nc = nc
        self._subject: Callable[[str], str] = (
            subjects.transcript if host_id is None else functools.partial(subjects.host_transcript, host_id)
        )
        self._loop = loop
        self._health = health or BusHealth()
        self._bus = self._health.retry("publishing transcript lines")
        self._waiting: deque[Line] = deque()
        self._dropped_while_away = 0
        self._dropped_behind = 0
        self._sending: asyncio.Task[None] | None = None

    def line(
        self, environment_id: str, kind: TranscriptKind, source: str, text: str, message_id: str | None = None
    ) -> None:
        """`message_id` names a line that may be published again (see the stream's duplicate window)."""
        line = TranscriptLine(
            occurred_at=datetime.now(UTC),
            environment_id=environment_id,
            kind=kind,
            source=source,
            text=text.rstrip("\n"),
        )
        payload = msgspec.json.encode(line)
        headers = None if message_id is None else {"Nats-Msg-Id": message_id}
        queued = (self._subject(environment_id), payload, headers)
        if _running_loop() is self._loop:
            # A hook's output comes from the loop itself, line after line: call_soon_threadsafe
            # would wake the loop through its self-pipe once per line.
            self._queue(queued)
        else:
            self._loop.call_soon_threadsafe(self._queue, queued)

    def _queue(self, line: Line) -> None:
        if len(self._waiting) == MAX_WAITING_LINES:
            self._waiting.popleft()
            if self._health.available:
                self._dropped_behind += 1
            else:
                self._dropped_while_away += 1
        self._waiting.append(line)
        if self._sending is None or self._sending.done():
            self._sending = self._loop.create_task(self._send_waiting())

    async def _send_waiting(self) -> None:
        while self._waiting:
            subject, payload, headers = self._waiting.popleft()
            while True:
                try:
                    await self._nc.publish(subject, payload, headers=headers)
                except BUS_UNAVAILABLE as error:
                    await self._bus.pause(error)
                    continue
                except Exception as error:
                    log.warning("transcript line dropped: %s", error)
                    break
                self._bus.succeeded()
                break
            self._tell_dropped()

    def _tell_dropped(self) -> None:
        if self._dropped_while_away:
            log.warning(
                "%d transcript line(s) were dropped while the bus was away (at most %d wait)",
                self._dropped_while_away,
                MAX_WAITING_LINES,
            )
            self._dropped_while_away = 0
        if self._dropped_behind:
            log.warning(
                "%d transcript line(s) were dropped: they came faster than they could be published (at most %d wait)",
                self._dropped_behind,
                MAX_WAITING_LINES,
            )
            self._dropped_behind = 0


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # a worker thread's provider report
        return None
