"""Statuses are enums in the code and the same bare strings everywhere they leave it."""

from datetime import UTC, datetime

import msgspec
import pytest

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.domain.status import EnvironmentStatus, HookStatus, ThreadStatus
from bb_environments.handlers.application import Environments
from bb_environments.projections.views import HookView

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def app():
    application = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 600_000)
    yield application
    application.close()


def walk_a_lifecycle(app):
    """Every status an environment and its hooks pass through, retiring included."""
    app.register_thread("t1", "/repo", None, "local", None)
    env = app.claim_environment("t1", "git-worktree", "local", "/repo", {}, "t1", "/data/t1")
    app.record_created(env.id, 1, "/data/t1", True, "main", None)
    app.start_setup(env.id)
    app.record_setup_outcome(env.id, app.environment(env.id).setup_operation_id, True, None)
    app.archive_thread("t1", NOW)
    app.request_deletion(env.id)
    app.start_removal(env.id, NOW)
    app.start_teardown(env.id)
    app.record_teardown_outcome(env.id, app.environment(env.id).teardown_operation_id, "failed", "exit 1")
    app.record_removed(env.id, 1)
    return env.id


def test_the_log_holds_no_status_so_older_logs_load_unchanged(app):
    environment_id = walk_a_lifecycle(app)
    stored = app.recorder.select_notifications(start=1, limit=100)
    assert stored and all(b'"status"' not in n.state for n in stored)
    reloaded = app.environment(environment_id)
    assert reloaded.status is EnvironmentStatus.REMOVED and reloaded.teardown_status is HookStatus.FAILED
    assert app.thread("t1").status is ThreadStatus.ARCHIVED


def test_documents_and_views_encode_statuses_as_the_bare_strings(app):
    walk_a_lifecycle(app)
    documents = [logged for logged in LogReader(app).page(0) if hasattr(logged.document, "status")]
    statuses = []
    for logged in documents:
        as_string = msgspec.structs.replace(logged.document, status=str(logged.document.status))
        # The relay and the trusted log compare stream payloads with these bytes.
        assert logged.payload() == msgspec.json.encode(as_string)
        statuses.append(msgspec.json.decode(logged.payload())["status"])
    assert set(statuses) == {"creating", "provisioning", "ready", "retiring", "removing", "removed"}
    for status in HookStatus:
        assert msgspec.json.encode(HookView(status, "op")) == msgspec.json.encode(HookView(status.value, "op"))
