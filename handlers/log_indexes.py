"""State kept up to date from the log's events of a few types, reading only what is new."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Notification, Recording

from bb_environments.domain.topics import topic_prefixes

Fold = Callable[[Notification, "DomainEventProtocol[UUID] | None"], None]
"""A log index's fold: given a notification, and its domain event when a save of ours just made it
(else the fold decodes the notification if it needs the event)."""


def aggregate_id(notification: Notification) -> UUID:
    assert isinstance(
        notification.originator_id, UUID
    )  # our aggregates' ids are UUIDs, and the recorders return them so
    return notification.originator_id


class LogWatch:
    """What an application's log indexes know of the log besides its events: how many saves the
    application made (`saves`), and the log's head (`head`).

    Within `one_run` (one run of a command, handlers/store.py) the head is read once, by the first
    index that asks: the run's lookups then decide on one look at the log instead of a query of the
    head each. That look is as recent as each index's own would have been: it is taken within the
    run, and whatever another writer saves after it, the run could as well have missed by deciding
    a moment sooner. A decision that must not miss it is made on an aggregate its saves change
    (a host's HostClaims): loading that aggregate calls `look_again`, so the indexes read on to a
    head taken after it, and a save they still miss changed the aggregate since, which makes the
    run's own save conflict. Outside a run every index reads the head itself.

    An index behind the head catches up every index behind it with one read (`read_up_to`): a
    command's lookups in several indexes cost one query of the log, not one each.
    """

    def __init__(self, app: Application[UUID], saves: Callable[[], int]) -> None:
        self._app = app
        self.saves = saves
        self._in_run = False
        self._head: int | None = None
        self._indexes: list[LogIndex] = []

    def watched_by(self, index: LogIndex) -> None:
        self._indexes.append(index)

    def read_up_to(self, head: int) -> None:
        """Bring every index behind `head` up to it: one read of the events of all their types from
        where the furthest behind stopped, each folded by the indexes that had not read it."""
        behind = [index for index in self._indexes if index.position < head]
        notifications = self._app.recorder.select_notifications(
            start=min(index.position for index in behind) + 1,
            stop=head,
            limit=10**9,
            topics=tuple(sorted({topic for index in behind for topic in index.topics})),
        )
        for index in behind:
            index.fold_read(notifications, head)

    def head(self) -> int:
        if self._head is not None:
            return self._head
        head = self._app.recorder.max_notification_id() or 0
        if self._in_run:
            self._head = head
        return head

    def look_again(self) -> None:
        """Let the run's next lookup read the head anew (see the class's note on HostClaims)."""
        self._head = None

    @contextlib.contextmanager
    def one_run(self) -> Iterator[None]:
        self._in_run, self._head = True, None
        try:
            yield
        finally:
            self._in_run, self._head = False, None


class LogIndex:
    """Keeps some state up to date from the log's events of a few types: every `catch_up` reads on
    from where the last one stopped, so it sees what any writer of the store saved since.

    It reads up to the head it found first, and goes on from there next time: the events of other
    types in between are not scanned again. The head is a safe place to stop because the stores
    commit notifications in id order (SQLite has one writer at a time; eventsourcing's PostgreSQL
    recorder locks the table for each insert), so no smaller id can still appear behind it. For the
    same reason a save of the application's own whose first notification follows on from where the
    index stopped has nothing of another writer before it: the index folds it from what it wrote,
    and reads the log next only once the head has moved past it.
    """

    def __init__(
        self, app: Application[UUID], watch: LogWatch, aggregate: type, event_names: tuple[str, ...], fold: Fold
    ) -> None:
        self._app = app
        self._watch = watch
        self.topics = tuple(prefix + name for prefix in topic_prefixes(aggregate) for name in event_names)
        self._fold = fold
        self.position = 0
        """The log is read up to here: whatever comes, comes after it."""
        watch.watched_by(self)

    def catch_up(self) -> None:
        head = self._watch.head()
        if head > self.position:
            self._watch.read_up_to(head)

    def fold_read(self, notifications: Sequence[Notification], head: int) -> None:
        """Fold what a read of the log up to `head` found of this index's events past where it stopped."""
        for notification in notifications:
            if notification.id > self.position and notification.topic in self.topics:
                self._fold(notification, None)
                self.position = notification.id
        self.position = head

    def saved(self, recordings: list[Recording[UUID]]) -> None:
        """A save of the application's own: folded from its recordings as far as they follow on from
        where the index stopped; from the first that does not (another writer saved in between, or
        a failed save left a gap), the next `catch_up` reads them, with whatever came before them."""
        for recording in recordings:
            notification = recording.notification
            if notification.id != self.position + 1:
                return
            if notification.topic in self.topics:
                self._fold(notification, recording.domain_event)
            self.position = notification.id


class SingleWriterLogIndex(LogIndex):
    """A log index of a store with one writer, the application itself: the log can have grown only
    by a save of its own, so while the application's count of saves (`saves`) is unchanged the log
    is not read at all, and an index that had read the whole log before a save folds that save's
    events from its recordings, without reading them back (every save changes the count, so
    otherwise each command's lookup read the log).
    """

    def __init__(
        self, app: Application[UUID], watch: LogWatch, aggregate: type, event_names: tuple[str, ...], fold: Fold
    ) -> None:
        super().__init__(app, watch, aggregate, event_names, fold)
        self._read_after: int | None = None  # the count of saves when it last read the log

    def catch_up(self) -> None:
        saves = self._watch.saves()
        if saves == self._read_after:
            return
        self._fold_all(
            self._app.recorder.select_notifications(start=self.position + 1, limit=10**9, topics=self.topics)
        )
        self._read_after = saves

    def _fold_all(self, notifications: Sequence[Notification]) -> None:
        for notification in notifications:
            self._fold(notification, None)
            self.position = notification.id

    def saved(self, recordings: list[Recording[UUID]]) -> None:
        """Fold what the save just counted wrote, if the index had read everything before it; else
        (never read yet, or behind a save that failed half way) its next `catch_up` reads the log."""
        saves = self._watch.saves()
        if self._read_after != saves - 1:
            return
        for recording in recordings:
            notification = recording.notification
            if notification.topic in self.topics:
                self._fold(notification, recording.domain_event)
                self.position = notification.id
        self._read_after = saves
