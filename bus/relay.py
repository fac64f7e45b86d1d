"""The outbox relay: copies the event store's notification log into JetStream, in order, once.

The stream itself is the cursor: on start (and after any ambiguous publish) the relay reads the
notification id of the stream's last message and continues after it. Each message carries
`Nats-Msg-Id` = its notification id, and `Nats-Expected-Last-Msg-Id` = the previous one, so a
retry is deduplicated and a second relay with a stale view is refused instead of reordering.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from bus import subjects
from bus.log_reader import LoggedDocument
from bus.crash_points import crash_point

log = logging.getLogger(__name__)

NOTIFICATION_HEADER = "Bb-Notification-Id"
PageReader = Callable[[int], Awaitable[list[LoggedDocument]]]


def message_id(notification_id: int) -> str:
    return f"bb:{notification_id}"


class OutboxRelay:
    def __init__(self, js: JetStreamContext, read_page: PageReader, poll_seconds: float = 1.0) -> None:
        self._js = js
        self._read_page = read_page
        self._poll_seconds = poll_seconds
        self._wakeup = asyncio.Event()
        self.position = 0
        self.caught_up = asyncio.Event()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        self.position = await self.stream_position()
        while True:
            self._wakeup.clear()
            page = await self._read_page(self.position)
            if not page:
                self.caught_up.set()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), self._poll_seconds)
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                for logged in page:
                    await self._publish(logged)
            except (APIError, NatsTimeout, asyncio.TimeoutError) as ambiguous:
                # Stored or not, we cannot tell: the stream knows. Re-read it and go on from there.
                log.warning("relay publish was ambiguous (%s); re-reading the stream position", ambiguous)
                await asyncio.sleep(0.2)
                self.position = await self.stream_position()

    async def _publish(self, logged: LoggedDocument) -> None:
        headers = {"Nats-Msg-Id": message_id(logged.notification_id), NOTIFICATION_HEADER: str(logged.notification_id)}
        if self.position:
            headers["Nats-Expected-Last-Msg-Id"] = message_id(self.position)
        await self._js.publish(logged.subject, logged.payload(), headers=headers, timeout=5)
        crash_point("relay-published")
        self.position = logged.notification_id

    async def stream_position(self) -> int:
        info = await self._js.stream_info(subjects.ENVIRONMENTS_STREAM)
        if info.state.messages == 0:
            return 0
        try:
            last = await self._js.get_msg(subjects.ENVIRONMENTS_STREAM, info.state.last_seq)
        except NotFoundError:
            return 0
        return int((last.headers or {}).get(NOTIFICATION_HEADER, "0"))
