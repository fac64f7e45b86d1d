"""An environment's past, read from the event store, is what the read model held at each version:
the same fold and the same view, event for event, on a log holding every event of an environment."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID, uuid4

import pytest

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import UnknownEnvironment
from bb_environments.domain.thread import thread_aggregate_id
from bb_environments.projections.history import EnvironmentHistory, NotRecorded
from bb_environments.projections.views import EnvironmentView
from tests.unit.test_event_documents import record_every_event
from tests.unit.test_fold import app  # noqa: F401  # the SQLite and in-memory stores

pytestmark = pytest.mark.usefixtures("app")


def read_model_views(app) -> dict[UUID, list[EnvironmentView]]:  # noqa: F811
    """Each environment's views as the read model is given them, one per event, in log order."""
    views: dict[UUID, list[EnvironmentView]] = {}
    for logged in LogReader(app).page(0, 10**6):
        if isinstance(logged.view, EnvironmentView):
            views.setdefault(UUID(logged.view.id), []).append(logged.view)
    return views


def longest_history(app) -> tuple[UUID, list[EnvironmentView]]:  # noqa: F811
    record_every_event(app)
    return max(read_model_views(app).items(), key=lambda item: len(item[1]))


def test_the_document_at_every_version_is_the_read_models_then(app):  # noqa: F811
    record_every_event(app)
    history = EnvironmentHistory(app)

    for environment_id, views in read_model_views(app).items():
        assert [view.version for view in views] == list(range(1, len(views) + 1))
        assert [history.at_version(environment_id, view.version) for view in views] == views


def test_the_document_at_an_instant_is_the_last_version_recorded_by_then(app):  # noqa: F811
    environment_id, views = longest_history(app)
    history = EnvironmentHistory(app)

    for view in views:
        assert history.at_instant(environment_id, view.updated_at) == max(
            (earlier for earlier in views if earlier.updated_at <= view.updated_at), key=lambda v: v.version
        )
        between = view.updated_at + timedelta(microseconds=1)
        assert history.at_instant(environment_id, between).updated_at <= between
    assert history.at_instant(environment_id, views[-1].updated_at + timedelta(days=365)) == views[-1]


def test_the_events_come_in_pages_each_with_the_time_to_the_next(app):  # noqa: F811
    environment_id, views = longest_history(app)
    history = EnvironmentHistory(app)

    pages, after, more = [], 0, True
    while more:
        page, more = history.events(environment_id, after, 4)
        assert 0 < len(page) <= 4
        pages.append(page)
        after = page[-1].version
    logged = [event for page in pages for event in page]

    assert len(pages) == -(-len(views) // 4)
    assert [event.version for event in logged] == [view.version for view in views]
    assert [event.occurred_at for event in logged] == [view.updated_at for view in views]
    assert [event.duration_ms for event in logged] == [
        (later.updated_at - view.updated_at) // timedelta(milliseconds=1) for view, later in zip(views, views[1:])
    ] + [None]
    assert logged[0].event_class is Environment.Claimed
    assert history.events(environment_id, len(views), 4) == ([], False)


def test_what_the_log_does_not_hold_is_refused_naming_what_it_does(app):  # noqa: F811
    environment_id, views = longest_history(app)
    history = EnvironmentHistory(app)
    latest = len(views)

    with pytest.raises(
        NotRecorded, match=f"environment {environment_id} has versions 1-{latest}: there is no version {latest + 1}"
    ):
        history.at_version(environment_id, latest + 1)
    with pytest.raises(NotRecorded, match=f"has versions 1-{latest}: there is no version {2**64}"):
        history.at_version(environment_id, 2**64)  # past what any store's column holds
    assert history.events(environment_id, 2**64, 10) == ([], False)
    with pytest.raises(NotRecorded, match="was first recorded at .*: nothing of it was recorded at .* or before"):
        history.at_instant(environment_id, views[0].created_at - timedelta(microseconds=1))
    # A thread's aggregate has a UUID too; it is no environment.
    for unknown in (uuid4(), thread_aggregate_id("t-1")):
        with pytest.raises(UnknownEnvironment, match=f"no environment {unknown}"):
            history.at_version(unknown, 1)
        with pytest.raises(UnknownEnvironment):
            history.at_instant(unknown, views[-1].updated_at)
        with pytest.raises(UnknownEnvironment):
            history.events(unknown, 0, 10)
        with pytest.raises(UnknownEnvironment):
            history.events(unknown, 3, 10)
