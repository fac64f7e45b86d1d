"""One environment's past, read from the event store: its events in log order, and its document
as it was after any one of them.

A past document is made as the read model's are: each event decoded and folded onto the
aggregate by projections/fold.py, the result viewed by projections/views.py. So the document
at a version is the one `show` printed while that version was the latest, field for field.

Everything here reads the store (the truth), never the read model or the stream: the callers run
it on the store's reader thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import StoredEvent

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import UnknownEnvironment
from bb_environments.domain.topics import topic_prefixes
from bb_environments.projections.fold import EventDecoder, fold
from bb_environments.projections.views import EnvironmentView, environment_view

_ENVIRONMENT_TOPICS = topic_prefixes(Environment)
_MILLISECOND = timedelta(milliseconds=1)
_LARGEST_STORED = 2**63 - 1
"""No store's version column holds more (SQLite's INTEGER, PostgreSQL's bigint); asked for past it,
a store fails rather than finding nothing."""


class LoggedEvent(NamedTuple):
    version: int
    event_class: type
    """What the bus calls it is the bus's to say (its documents' `type`)."""
    occurred_at: datetime
    duration_ms: int | None
    """The time from this event to the environment's next one (None: none follows yet)."""


class NotRecorded(Exception):
    """The version or instant asked for is not in the environment's log; the message says what is."""


class EnvironmentHistory:
    def __init__(self, app: Application[UUID]) -> None:
        self._recorder = app.recorder
        self._decoder = EventDecoder(app.mapper)

    def events(self, environment_id: UUID, after: int, limit: int) -> tuple[list[LoggedEvent], bool]:
        """The environment's events after version `after`, at most `limit` of them, and whether
        more follow. Raises UnknownEnvironment when the log holds no such environment."""
        # One more than asked: the last one's duration, and whether another page follows.
        stored = self._stored(environment_id, gt=min(after, _LARGEST_STORED), limit=limit + 1)
        decoded = [self._decoder.decode(event) for event in stored]
        if not decoded and (after == 0 or not self._stored(environment_id, limit=1)):
            raise _unknown(environment_id)
        logged = [
            LoggedEvent(
                event.originator_version,
                type(event),
                event.timestamp,
                (following.timestamp - event.timestamp) // _MILLISECOND if following else None,
            )
            for event, following in zip(decoded, [*decoded[1:], None])
        ]
        return logged[:limit], len(logged) > limit

    def at_version(self, environment_id: UUID, version: int) -> EnvironmentView:
        """The environment's document just after its event of `version`."""
        stored = self._stored(environment_id, lte=min(version, _LARGEST_STORED))
        if not stored:
            raise _unknown(environment_id)
        if len(stored) < version:  # versions are gap-free from 1: these are all there are
            raise NotRecorded(
                f"environment {environment_id} has versions 1-{len(stored)}: there is no version {version}"
            )
        return _view_after(map(self._decoder.decode, stored))

    def latest(self, environment_id: UUID) -> EnvironmentView:
        """The environment's document after its last event: what `show` answers for an environment
        the read model no longer keeps (removed longer than retention ago)."""
        stored = self._stored(environment_id)
        if not stored:
            raise _unknown(environment_id)
        return _view_after(map(self._decoder.decode, stored))

    def at_instant(self, environment_id: UUID, instant: datetime) -> EnvironmentView:
        """The environment's document just after the last event recorded at `instant` or before."""
        stored = self._stored(environment_id)
        if not stored:
            raise _unknown(environment_id)
        decoded = map(self._decoder.decode, stored)
        first = next(decoded)
        if first.timestamp > instant:
            raise NotRecorded(
                f"environment {environment_id} was first recorded at {first.timestamp.isoformat()}: "
                f"nothing of it was recorded at {instant.isoformat()} or before"
            )
        recorded = itertools.takewhile(lambda event: event.timestamp <= instant, itertools.chain([first], decoded))
        return _view_after(recorded)

    def _stored(self, environment_id: UUID, **among: Any) -> Sequence[StoredEvent]:
        """The stored events of the aggregate `environment_id` that `among` selects (select_events'
        bounds), none when that aggregate is not an environment (a thread's id is a UUID too)."""
        stored = self._recorder.select_events(environment_id, **among)
        return stored if stored and stored[0].topic.startswith(_ENVIRONMENT_TOPICS) else []


def _view_after(events: Iterable[Any]) -> EnvironmentView:
    aggregate = None
    for event in events:
        aggregate = fold(aggregate, event)
    assert isinstance(aggregate, Environment)
    return environment_view(aggregate)


def _unknown(environment_id: UUID) -> UnknownEnvironment:
    return UnknownEnvironment(f"no environment {environment_id}")
