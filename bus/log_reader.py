"""Turns the event store's notification log into the documents the bus carries.

Each notification becomes its public document (`bus.documents`) and, for the read model, the
public view of its aggregate just after it (`projections.views`). One mapping serves the relay,
the consumers that check the stream against the store, and `bb events replay`, so a rebuilt read
model equals the live one by construction. Runs on the store's log-reader thread.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple
from uuid import UUID

import msgspec
from eventsourcing.application import Application

from bb_environments.bus.documents import Document, document_for
from bb_environments.projections.views import EnvironmentView, ThreadView, public_view

_CACHED_AGGREGATES = 4096


class LoggedDocument(NamedTuple):
    notification_id: int
    subject: str
    document: Document
    view: EnvironmentView | ThreadView | None = None
    """What the read model keeps of the aggregate just after this event; not published."""

    def payload(self) -> bytes:
        return msgspec.json.encode(self.document)

    def matches(self, subject: str, payload: bytes | None) -> bool:
        """Whether a stream message is this document as the relay publishes it, byte for byte."""
        return subject == self.subject and (payload or b"") == self.payload()


class LogReader:
    def __init__(self, app: Application[UUID]) -> None:
        self._app = app
        self._states: OrderedDict[UUID, Any] = OrderedDict()

    def head(self) -> int:
        return self._app.recorder.max_notification_id() or 0

    def page(self, after: int, limit: int = 500) -> list[LoggedDocument]:
        notifications = self._app.recorder.select_notifications(start=after + 1, limit=limit)
        return [self._document(n) for n in notifications]

    def between(self, after: int, upto: int) -> list[tuple[int, EnvironmentView | ThreadView | None]]:
        """The read model's views of the notifications after `after` up to and including `upto`, in order."""
        notifications = self._app.recorder.select_notifications(start=after + 1, limit=upto - after, stop=upto)
        return [(logged.notification_id, logged.view) for logged in map(self._document, notifications)]

    def at(self, notification_ids: Iterable[int]) -> dict[int, LoggedDocument]:
        """The documents of those of these notification ids that the store holds.

        Ids that a stream message merely claims can be anything: ids past the head are never read,
        and the rest one run of consecutive ids at a time, not as one range that could span the log.
        """
        head = self.head()
        found: dict[int, LoggedDocument] = {}
        for first, last in _runs(sorted({n for n in notification_ids if 0 < n <= head})):
            notifications = self._app.recorder.select_notifications(start=first, limit=last - first + 1, stop=last)
            found.update((logged.notification_id, logged) for logged in map(self._document, notifications))
        return found

    def _document(self, notification: Any) -> LoggedDocument:
        event = self._app.mapper.to_domain_event(notification)
        aggregate = self._state_after(event)
        subject, document = document_for(event, aggregate)
        return LoggedDocument(notification.id, subject, document, public_view(aggregate))

    def _state_after(self, event: Any) -> Any:
        # Folding events onto a cached state is far cheaper than replaying each aggregate again.
        identity = event.originator_id
        state = self._states.pop(identity, None)
        if state is None or state.version != event.originator_version - 1:
            state = None
            if event.originator_version > 1:
                state = self._app.repository.get(identity, version=event.originator_version - 1)
        state = event.mutate(state)
        self._states[identity] = state
        if len(self._states) > _CACHED_AGGREGATES:
            self._states.popitem(last=False)
        return state


def _runs(ids: list[int]) -> Iterator[tuple[int, int]]:
    """Sorted distinct ids as the (first, last) of each run of consecutive numbers."""
    for _, run in itertools.groupby(enumerate(ids), key=lambda indexed: indexed[1] - indexed[0]):
        numbers = [n for _, n in run]
        yield numbers[0], numbers[-1]
