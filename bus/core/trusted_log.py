"""Consumers of the log stream believe only what the event store wrote.

Anyone who can publish on a stored log subject can add a message to BB_ENVIRONMENTS, and a durable
consumer may fetch it before the relay deletes it. So each batch is checked against the store: a
message is admitted only if it is, byte for byte (subject and payload), what the store wrote under
the notification id it claims, and it is then used as the store's document, not decoded from the
wire. Anything else is skipped, with one warning line per batch, and acknowledged with the rest.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from nats.aio.msg import Msg

from bb_environments.bus.core.log_reader import LoggedDocument
from bb_environments.bus.core.relay import NotificationReader
from bb_environments.bus.wire.subjects import claimed_notification_id

log = logging.getLogger(__name__)


class Admitted(NamedTuple):
    message: Msg
    logged: LoggedDocument


class TrustedLog:
    def __init__(self, read_notifications: NotificationReader, consumer: str) -> None:
        self._read_notifications = read_notifications
        self._consumer = consumer

    async def admit(self, messages: list[Msg]) -> list[Admitted]:
        """The messages of the batch that the store wrote, in order, each with the store's document."""
        claims = [(message, claimed_notification_id(message.headers)) for message in messages]
        claimed_ids = [claimed for _, claimed in claims if claimed is not None]
        written = await self._read_notifications(claimed_ids) if claimed_ids else {}
        admitted, skipped = [], []
        for message, claimed in claims:
            logged = None if claimed is None else written.get(claimed)
            if logged is not None and logged.matches(message.subject, message.data):
                admitted.append(Admitted(message, logged))
            else:
                skipped.append(message.metadata.sequence.stream)
        if skipped:
            log.warning(
                "%s consumer skipped %d log stream message(s) the event store did not write (sequences %s)",
                self._consumer,
                len(skipped),
                ", ".join(map(str, skipped)),
            )
        return admitted
