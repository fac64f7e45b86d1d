"""The log reader's own decoding and fold give what eventsourcing's mapper and `mutate` give, event
for event, on a real SQLite log holding every event of every aggregate; what its fast path does not
take goes through the library and ends as the library ends it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from eventsourcing.application import Application
from eventsourcing.persistence import MapperDeserialisationError, StoredEvent

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.domain.environment import Environment
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.projections.fold import EventDecoder, fold
from tests.unit.test_event_documents import ALL_EVENTS, record_every_event


@pytest.fixture(params=["sqlite", "popo"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Application]:
    """The service's SQLite store (read as plain rows), and the library's in-memory one (read
    through `select_notifications`)."""
    env = (
        event_store_environment(f"sqlite:///{tmp_path / 'events.sqlite'}")
        if request.param == "sqlite"
        else {"PERSISTENCE_MODULE": "eventsourcing.popo"}
    )
    application = Application(env=env)
    yield application
    application.close()


def test_every_event_decodes_and_folds_as_the_library_does_it(app):
    record_every_event(app)
    notifications = LogReader(app)._notifications(1, 10**6)
    assert [(n.id, n.originator_id, n.originator_version, n.topic, n.state) for n in notifications] == [
        (n.id, n.originator_id, n.originator_version, n.topic, n.state)
        for n in app.recorder.select_notifications(start=1, limit=10**6)
    ]
    decoder = EventDecoder(app.mapper)
    ours: dict = {}
    libraries: dict = {}
    for notification in notifications:
        event, expected = decoder.decode(notification), app.mapper.to_domain_event(notification)
        assert type(event) is type(expected) and vars(event) == vars(expected)
        key = event.originator_id
        ours[key] = fold(ours.get(key), event)
        libraries[key] = expected.mutate(libraries.get(key))
        assert type(ours[key]) is type(libraries[key]) and vars(ours[key]) == vars(libraries[key])
    assert {type(decoder.decode(n)) for n in notifications} == ALL_EVENTS


def test_a_page_of_the_sqlite_log_stops_where_asked(app):
    record_every_event(app)
    reader = LogReader(app)
    assert [n.id for n in reader._notifications(3, 4)] == [3, 4, 5, 6]
    assert [n.id for n in reader._notifications(3, 100, stop=5)] == [3, 4, 5]
    assert reader._notifications(app.recorder.max_notification_id() + 1, 10) == []


def test_state_msgspec_does_not_read_as_the_library_does_is_decoded_by_the_library(app):
    """Floats the stdlib writes and reads but JSON has not (NaN, infinity), and a user's dict that
    looks like a transcoded value: each ends as the library's own decoding ends, with the same
    values or the same error."""
    environment = Environment(
        provider_id="modal-sandbox",
        host_id="local",
        project_path=None,
        inputs={"size": float("nan"), "limit": float("inf")},
        path_key="k",
        claimed_path=None,
        thread_id="t-1",
    )
    environment.record_create_failed(1, "transient", "the cloud said no")
    environment.record_attempt_cleaned(1)
    app.save(environment)
    decoder = EventDecoder(app.mapper)
    for notification in app.recorder.select_notifications(start=1, limit=10):
        event, expected = decoder.decode(notification), app.mapper.to_domain_event(notification)
        assert repr(vars(event)) == repr(vars(expected))  # repr: NaN is not equal to itself

    forged = StoredEvent(
        uuid4(),
        1,
        "bb_environments.domain.environment:Environment.Claimed",
        b'{"timestamp":{"_type_":"datetime_iso","_data_":"2026-12-01T12:00:00+00:00"},'
        b'"inputs":{"_type_":"not_a_transcoding","_data_":1}}',
    )
    with pytest.raises(MapperDeserialisationError) as ours:
        decoder.decode(forged)  # type: ignore[arg-type]  # a stored event, as select_notifications gives
    with pytest.raises(MapperDeserialisationError) as library:
        app.mapper.to_domain_event(forged)
    assert str(ours.value) == str(library.value)


def test_a_fold_onto_the_wrong_aggregate_or_version_is_refused_as_mutate_refuses_it(app):
    """An event of another aggregate, one that skips a version, a creation onto an existing aggregate."""
    record_every_event(app)
    notifications = app.recorder.select_notifications(start=1, limit=10**6)
    events = [app.mapper.to_domain_event(n) for n in notifications]
    first = next(e for e in events if e.originator_version == 1 and isinstance(e, Environment.Event))
    environment = first.mutate(None)
    later = [e for e in events if e.originator_id == environment.id and e.originator_version == 3][0]
    other = next(e for e in events if e.originator_id != environment.id and e.originator_version == 2)
    for event in (later, other, first):
        with pytest.raises(Exception) as ours:
            fold(copy.deepcopy(environment), event)
        with pytest.raises(Exception) as library:
            event.mutate(copy.deepcopy(environment))
        assert type(ours.value) is type(library.value)
