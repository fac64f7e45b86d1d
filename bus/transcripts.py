"""Transcript lines (provider steps, hook output) go to their own size-limited stream.

Publishing is fire-and-forget from any thread: progress must never block or fail a step.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone

import msgspec
from nats.aio.client import Client

from bus import subjects
from bus.documents import TranscriptLine

log = logging.getLogger(__name__)


class TranscriptPublisher:
    def __init__(self, nc: Client, loop: asyncio.AbstractEventLoop) -> None:
        self._nc = nc
        self._loop = loop

    def line(self, environment_id: str, kind: str, source: str, text: str, message_id: str | None = None) -> None:
        """`message_id` names a line that may be published again (see the stream's duplicate window)."""
        line = TranscriptLine(occurred_at=datetime.now(timezone.utc), environment_id=environment_id,
                              kind=kind, source=source, text=text.rstrip("\n"))
        payload = msgspec.json.encode(line)
        headers = None if message_id is None else {"Nats-Msg-Id": message_id}
        self._loop.call_soon_threadsafe(self._send, subjects.transcript(environment_id), payload, headers)

    def _send(self, subject: str, payload: bytes, headers: dict[str, str] | None) -> None:
        self._loop.create_task(self._publish(subject, payload, headers))

    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str] | None) -> None:
        try:
            await self._nc.publish(subject, payload, headers=headers)
        except Exception as error:
            log.warning("transcript line dropped: %s", error)
