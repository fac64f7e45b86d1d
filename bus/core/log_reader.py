"""Turns the event store's notification log into the documents the bus carries.

Each notification becomes its public document (bus/core/publications.py) and, for the read model, the
public view of its aggregate just after it (`projections.views`). One mapping serves the relay,
the consumers that check the stream against the store, and `bb events replay`, so a rebuilt read
model equals the live one by construction. The relay and consumers read on the store's log-reader
thread; a rebuild on its own worker thread (projections/rebuild_scratch.py).

A rebuild reads `latest_views` instead of `page`: it needs neither the bus documents nor a view
per event, only each aggregate's latest view per page, and making those was most of its time.

Every read goes through `_notifications`, and every event through `projections.fold` (decoded with
msgspec, folded by the aggregate's own methods). A recorder that reads the log as plain rows
(`select_rows`, the SQLite store's: entrypoints/sqlite_event_store.py) is read so; any other
through the library's `select_notifications`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable
from uuid import UUID

import msgspec
from eventsourcing.application import Application

from bb_environments.bus.core.publications import document_for
from bb_environments.bus.wire.documents import Document
from bb_environments.domain.topics import topic_prefixes
from bb_environments.projections.fold import EventDecoder, StoredNotification, fold
from bb_environments.projections.views import VIEWED_AGGREGATES, EnvironmentView, ThreadView, ViewPage, public_view

_CACHED_AGGREGATES = 4096
# The relay reads each notification first; both log consumers then ask for it again a moment later.
_CACHED_DOCUMENTS = 4096
# A rebuild writes each aggregate's latest view once per page: fewer, larger pages write fewer
# (a page of rows is a few MB).
REBUILD_PAGE = 10000
_VIEWED_TOPICS = tuple(prefix for aggregate in VIEWED_AGGREGATES for prefix in topic_prefixes(aggregate))


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


@runtime_checkable
class RowsRecorder(Protocol):
    """A recorder that reads the log as plain rows, cheaper than its notifications."""

    def select_rows(self, start: int, limit: int, stop: int | None = None) -> Sequence[StoredNotification]:
        """The notifications from `start` on, up to `stop` (None: the head), at most `limit` of them."""


class LogReader:
    def __init__(self, app: Application[UUID]) -> None:
        self._app = app
        self._decoder = EventDecoder(app.mapper)
        self._states: OrderedDict[int, Any] = OrderedDict()
        # Notifications never change once written, so a document made from one serves every reader.
        self._documents: OrderedDict[int, LoggedDocument] = OrderedDict()
        recorder = app.recorder
        self._select_rows = recorder.select_rows if isinstance(recorder, RowsRecorder) else None
        self._head_seen = 0  # the head only grows: ids up to it need no look at the head

    def head(self) -> int:
        return self._app.recorder.max_notification_id() or 0

    def page(self, after: int, limit: int = 500) -> list[LoggedDocument]:
        notifications = self._notifications(after + 1, limit)
        return [self._document(n) for n in notifications]

    def between(self, after: int, upto: int) -> list[tuple[int, EnvironmentView | ThreadView | None]]:
        """The read model's views of the notifications after `after` up to and including `upto`, in order."""
        notifications = self._notifications(after + 1, upto - after, upto)
        return [(logged.notification_id, logged.view) for logged in map(self._document, notifications)]

    def latest_views(self, after: int, upto: int | None = None, limit: int = REBUILD_PAGE) -> ViewPage:
        """The views of the aggregates that the notifications after `after` (up to and including
        `upto`, at most `limit` of them) touch, each as it is after the last of them (ViewPage)."""
        notifications = self._notifications(after + 1, limit, upto)
        touched: dict[int, Any] = {}
        for notification in notifications:
            if not notification.topic.startswith(_VIEWED_TOPICS):
                continue  # an aggregate the read model keeps nothing of: not even decoded
            event = self._decoder.decode(notification)
            key = event.originator_id.int
            touched.pop(key, None)  # moved to the end: the order is that of last touches
            touched[key] = self._state_after(event)
        views = [view for view in map(public_view, touched.values()) if view is not None]
        return ViewPage(notifications[-1].id if notifications else after, len(notifications), views)

    def at(self, notification_ids: Iterable[int]) -> dict[int, LoggedDocument]:
        """The documents of those of these notification ids that the store holds.

        Ids that a stream message merely claims can be anything: ids past the head are never read,
        and the rest one run of consecutive ids at a time, not as one range that could span the log.
        """
        found: dict[int, LoggedDocument] = {}
        missing = set()
        for n in notification_ids:
            if (logged := self._documents.get(n)) is not None:
                found[n] = logged
            else:
                missing.add(n)
        if not missing:
            return found
        if max(missing) > self._head_seen:
            self._head_seen = self.head()
        head = self._head_seen
        for first, last in _runs(sorted({n for n in missing if 0 < n <= head})):
            notifications = self._notifications(first, last - first + 1, last)
            found.update((logged.notification_id, logged) for logged in map(self._document, notifications))
        return found

    def _notifications(self, start: int, limit: int, stop: int | None = None) -> Sequence[StoredNotification]:
        """The notifications from `start` on, up to `stop` (None: the head), at most `limit` of them."""
        if self._select_rows is not None:
            return self._select_rows(start, limit, stop)
        return self._app.recorder.select_notifications(start=start, limit=limit, stop=stop)

    def _document(self, notification: StoredNotification) -> LoggedDocument:
        event = self._decoder.decode(notification)
        aggregate = self._state_after(event)
        subject, document = document_for(event, aggregate)
        logged = LoggedDocument(notification.id, subject, document, public_view(aggregate))
        self._documents[notification.id] = logged
        if len(self._documents) > _CACHED_DOCUMENTS:
            self._documents.popitem(last=False)
        return logged

    def _state_after(self, event: Any) -> Any:
        # Folding events onto a cached state is far cheaper than replaying each aggregate again.
        # (Keyed by the UUID's int: hashing a UUID runs Python code, and a replay does it per event.)
        key = event.originator_id.int
        state = self._states.get(key)
        if state is None or state.version != event.originator_version - 1:
            state = None
            if event.originator_version > 1:
                state = self._app.repository.get(event.originator_id, version=event.originator_version - 1)
        else:
            self._states.move_to_end(key)
        state = fold(state, event)
        self._states[key] = state
        if len(self._states) > _CACHED_AGGREGATES:
            self._states.popitem(last=False)
        return state


def _runs(ids: list[int]) -> Iterator[tuple[int, int]]:
    """Sorted distinct ids as the (first, last) of each run of consecutive numbers."""
    for _, run in itertools.groupby(enumerate(ids), key=lambda indexed: indexed[1] - indexed[0]):
        numbers = [n for _, n in run]
        yield numbers[0], numbers[-1]
