"""The core's ports onto the JetStream streams: the environments stream's position, and a thread's
first message, published once."""

from __future__ import annotations

from datetime import datetime

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.thread_events import ThreadMessageMessage


class StreamPorts:
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    async def stream_position(self) -> int:
        info = await self._js.stream_info(subjects.ENVIRONMENTS_STREAM)
        return info.state.last_seq

    async def publish_thread_message(self, thread_id: str, text: str, occurred_at: datetime) -> None:
        """One first message per thread, even when a spawn is sent again: within the duplicate
        window the stream drops the copy, and after it the stream still holds the first."""
        message = ThreadMessageMessage(thread_id=thread_id, text=text, occurred_at=occurred_at)
        subject = subjects.thread_event(message.thread_id, "message")
        try:
            await self._js.get_last_msg(subjects.THREADS_STREAM, subject)
            return
        except NotFoundError:
            pass
        await self._js.publish(
            subject, msgspec.json.encode(message), headers={"Nats-Msg-Id": f"{message.thread_id}:prompt"}
        )
