"""The library internals the service still relies on, where the library offers no public route
(docs/architecture.md, "Library internals still used"), were read in one version of each library:
a new version fails here until someone reads them again and moves the pin. Their behaviour is held
by the tests named beside each."""

from __future__ import annotations

from importlib.metadata import version

from eventsourcing.domain import Aggregate

from bb_environments.projections import fold
from tests.unit.test_event_documents import ALL_EVENTS

READ_IN = {
    # projections/fold.py: `decorated_funcs`, `DecoratedFuncCaller`, `CanMutateAggregate` (the @event
    # machinery), `JSONTranscoder.names`, and events built as the mapper builds them (tests/unit/test_fold.py);
    # entrypoints/sqlite_event_store.py: the SQLite recorder's and datastore's members its subclasses use
    # (tests/unit/test_fold.py, tests/unit/test_config.py).
    "eventsourcing": "9.5.6"
}


def test_the_libraries_are_the_versions_whose_internals_were_read():
    assert {name: version(name) for name in READ_IN} == READ_IN


def test_the_fast_fold_calls_the_aggregates_own_method_for_every_event_but_a_creation():
    """Were the @event machinery to change shape, the fold would fall back on the library's `mutate`
    for every event: right, but a replay several times slower, and no other test would notice."""
    # An event class that applies itself (ProjectSecrets' two, which keep their own time) is
    # folded by the library's `mutate` by design.
    changes = [
        event_class
        for event_class in ALL_EVENTS
        if not issubclass(event_class, Aggregate.Created)
        and not event_class.apply.__module__.startswith("bb_environments")
    ]
    assert len(changes) > 30
    assert [event_class.__qualname__ for event_class in changes if fold._method(event_class) is None] == []
