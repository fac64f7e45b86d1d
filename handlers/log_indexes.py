"""State kept up to date from the log's events of a few types, reading only what is new."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Notification, Recording

from bb_environments.domain.topics import topic_prefixes

Fold = Callable[[Notification, "DomainEventProtocol[UUID] | None"], None]
"""A log index's fold: given a notification, and its domain event when a save of ours just made it
(else the fold decodes the notification if it needs the event)."""


class LogIndex:
    """Keeps some state up to date from the log's events of a few types, reading only what is new.

    `saves` counts the application's saves: with one writer per store, the log can have grown only
    by a save of its own, so while the count is unchanged the log is not read at all, and an index
    that had read the whole log before a save folds that save's events from its recordings, without
    reading them back (every save changes the count, so otherwise each command's lookup read the log).
    """

    def __init__(self, app: Application[UUID], saves: Callable[[], int], aggregate: type,
                 event_names: tuple[str, ...], fold: Fold) -> None:
        self._app = app
        self._saves = saves
        self._topics = tuple(prefix + name for prefix in topic_prefixes(aggregate) for name in event_names)
        self._fold = fold
        self._position = 0
        self._read_after: int | None = None  # the count of saves when it last read the log

    def catch_up(self) -> None:
        saves = self._saves()
        if saves == self._read_after:
            return
        new = self._app.recorder.select_notifications(start=self._position + 1, limit=10**9, topics=self._topics)
        for notification in new:
            self._fold(notification, None)
            self._position = notification.id
        self._read_after = saves

    def saved(self, recordings: list[Recording[UUID]]) -> None:
        """Fold what the save just counted wrote, if the index had read everything before it; else
        (never read yet, or behind a save that failed half way) its next `catch_up` reads the log."""
        saves = self._saves()
        if self._read_after != saves - 1:
            return
        for recording in recordings:
            notification = recording.notification
            if notification.topic in self._topics:
                self._fold(notification, recording.domain_event)
                self._position = notification.id
        self._read_after = saves
