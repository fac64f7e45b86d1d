"""The log's events decoded and folded onto their aggregates, as eventsourcing's mapper and
`mutate` do it, at a fraction of their cost.

A rebuild of the read models decodes every event of the log and folds it onto its aggregate; the
library's general path (a JSON decoder calling back into Python for every object, then a `mutate`
that looks up each event's method and its parameters again) was most of a replay's time. Here:

- `EventDecoder` parses a stored event's state with msgspec and revives the library's transcoded
  values (`{"_type_": ..., "_data_": ...}`) with the application's own transcodings, exactly where
  the library's object hook would. Whatever this path does not take (a cipher, a compressor, an
  upcast event class, JSON that msgspec refuses, like NaN) goes through the mapper itself.
- `fold` calls the aggregate's own `@event` method with the event's values, as the library's
  `mutate` does, and falls back to `mutate` for any event class that changes it.

The aggregate's methods stay the one place that says what an event changes; nothing here knows
any event. tests/unit/test_fold.py holds both against the library's results on every event.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import msgspec
from eventsourcing.domain import (
    CanMutateAggregate,
    DecoratedFuncCaller,
    OriginatorIDError,
    OriginatorVersionError,
    decorated_funcs,
)
from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder, Mapper, StoredEvent, Transcoding, UUIDAsHex

from bb_environments.domain.topics import event_class

_json = msgspec.json.Decoder()
_DIRECT: dict[type[Transcoding], Callable[[Any], Any]] = {DatetimeAsISO: datetime.fromisoformat, UUIDAsHex: UUID}


class StoredState(Protocol):
    """A stored event: eventsourcing's `StoredEvent`, or a notification of the log."""

    @property
    def originator_id(self) -> UUID | str: ...
    @property
    def originator_version(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def state(self) -> bytes: ...


class StoredNotification(StoredState, Protocol):
    """A notification of the log: eventsourcing's `Notification`, or a row read as one."""

    @property
    def id(self) -> int: ...


class EventDecoder:
    """`decode(stored)`: its domain event, equal to `mapper.to_domain_event(stored)`."""

    def __init__(self, mapper: Mapper[UUID]) -> None:
        self._mapper = mapper
        transcoder = mapper.transcoder
        plain = type(transcoder) is JSONTranscoder and not mapper.cipher and not mapper.compressor
        transcodings = transcoder.names if isinstance(transcoder, JSONTranscoder) else {}
        # By name, what revives a transcoded value: the library's own two most common ones called
        # directly, without their Python-level `decode` around it (which only asserts a str: see _revive).
        self._revivers: dict[str, Callable[[Any], Any]] = {
            name: _DIRECT.get(type(transcoding), transcoding.decode) for name, transcoding in transcodings.items()
        }
        self._plain = plain
        self._classes: dict[str, type | None] = {}
        """By topic: the event class, when this decoder's path may decode its events (None: the mapper's)."""

    def decode(self, notification: StoredState) -> Any:
        topic = notification.topic
        try:
            known_class = self._classes[topic]
        except KeyError:
            known_class = self._classes.setdefault(topic, self._class(topic))
        if known_class is None or type(notification.originator_id) is not UUID:
            return self._by_the_mapper(notification)
        try:
            state = self._revive(_json.decode(notification.state))
        except Exception:
            # Not JSON that msgspec reads as the library does, or a value no transcoding revives:
            # the library's own path decodes it, or raises its own error.
            return self._by_the_mapper(notification)
        if type(state) is not dict or "class_version" in state:
            return self._by_the_mapper(notification)
        state["originator_id"] = notification.originator_id
        state["originator_version"] = notification.originator_version
        event: Any = object.__new__(known_class)
        object.__setattr__(event, "__dict__", state)  # as the mapper builds it: the class is frozen
        return event

    def _class(self, topic: str) -> type | None:
        found = event_class(topic)
        # An upcast class rewrites its old events' state as the mapper decodes them.
        return found if self._plain and getattr(found, "class_version", 1) == 1 else None

    def _by_the_mapper(self, notification: StoredState) -> Any:
        return self._mapper.to_domain_event(
            StoredEvent(
                notification.originator_id, notification.originator_version, notification.topic, notification.state
            )
        )

    def _revive(self, value: Any) -> Any:
        """The library's object hook applied to every JSON object in `value`, innermost first."""
        if type(value) is dict:
            for key, item in value.items():
                if type(item) is dict:
                    if len(item) == 2 and type(item.get("_data_")) is str and "_type_" in item:
                        # A transcoded value with nothing inside to revive first: most are (datetime, UUID).
                        value[key] = self._revivers[item["_type_"]](item["_data_"])
                    else:
                        value[key] = self._revive(item)
                elif type(item) is list:
                    value[key] = self._revive(item)
            if len(value) == 2 and "_type_" in value and "_data_" in value:
                return self._revivers[value["_type_"]](value["_data_"])
        elif type(value) is list:
            for index, item in enumerate(value):
                if type(item) is dict or type(item) is list:
                    value[index] = self._revive(item)
        return value


def fold(aggregate: Any, event: Any) -> Any:
    """`event.mutate(aggregate)`: the aggregate just after `event` (None: before its first event),
    changed in place, as the library's `mutate` changes it."""
    event_class = type(event)
    try:
        method = _methods[event_class]
    except KeyError:
        method = _methods.setdefault(event_class, _method(event_class))
    if method is None or aggregate is None:
        return event.mutate(aggregate)
    if event.originator_id is not aggregate.id and event.originator_id != aggregate.id:  # UUID's == is Python code
        raise OriginatorIDError(event.originator_id, aggregate.id)
    if event.originator_version != aggregate.version + 1:
        raise OriginatorVersionError(event.originator_version, aggregate.version + 1)
    function, parameters = method
    function(aggregate, **{name: value for name, value in vars(event).items() if name in parameters})
    aggregate.version = event.originator_version
    aggregate.modified_on = event.timestamp
    return aggregate


_Method = tuple[Callable[..., None], frozenset[str]]
_methods: dict[type, _Method | None] = {}


def _method(event_class: type[CanMutateAggregate[Any]]) -> _Method | None:
    """The aggregate method an event class applies and its parameters, when calling it is all
    that the class's `mutate` does besides the version and time (None: another class, or one that
    changes `mutate` or `apply`)."""
    if event_class.mutate is not CanMutateAggregate.mutate or event_class.apply is not DecoratedFuncCaller.apply:
        return None
    # DecoratedFuncCaller.apply ends by calling the next `apply` up its class's order.
    after = event_class.__mro__[event_class.__mro__.index(DecoratedFuncCaller) + 1 :]
    if next(base for base in after if "apply" in vars(base)) is not CanMutateAggregate:
        return None
    function = decorated_funcs[event_class]
    if not inspect.isfunction(function):
        return None
    return function, frozenset(inspect.signature(function).parameters)
