"""What the log tells a host agent about a hook operation id (the ledger behind its guard)."""

from datetime import datetime, timezone

import pytest

from bb_environments.domain.application import Environments, RecordedHook

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
PATH = "/data/worktrees/t1/repo"


@pytest.fixture
def app():
    application = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 0)
    yield application
    application.close()


def provisioning(app, thread_id="t1"):
    app.register_thread(thread_id, "/repo", None, "local", None)
    environment = app.claim_environment(thread_id, "git-worktree", "local", "/repo", {}, thread_id, PATH)
    app.record_created(environment.id, 1, PATH, True, "main", None)
    return environment.id


def test_an_operation_the_log_never_started_is_unknown_whatever_it_looks_like(app):
    environment_id = provisioning(app)
    assert app.recorded_hook("forged") is None
    assert app.recorded_hook(f"{environment_id}.setup.1.1") is None  # the id setup would get, not yet started
    assert app.recorded_hook(f"{environment_id}.teardown") is None


def test_a_running_setup_may_run_in_its_recorded_path_and_may_not_be_stopped(app):
    environment_id = provisioning(app)
    app.start_setup(environment_id)
    operation = app.environment(environment_id).setup_operation_id

    assert app.recorded_hook(operation) == RecordedHook(
        operation_id=operation, environment_id=str(environment_id), kind="setup", host_id="local",
        workspace=PATH, awaited=True, stoppable=False,
    )


def test_a_cancelled_environment_s_running_setup_may_be_joined_and_stopped(app):
    environment_id = provisioning(app)
    app.start_setup(environment_id)
    operation = app.environment(environment_id).setup_operation_id
    app.cancel_thread_message("t1")

    recorded = app.recorded_hook(operation)
    assert recorded.awaited and recorded.stoppable


def test_once_its_outcome_is_recorded_a_setup_runs_no_more_and_stopping_it_is_harmless(app):
    environment_id = provisioning(app)
    app.start_setup(environment_id)
    operation = app.environment(environment_id).setup_operation_id
    app.record_setup_outcome(environment_id, operation, False, "boom")

    failed = app.recorded_hook(operation)
    assert not failed.awaited and failed.stoppable

    app.retry(environment_id, "t1", PATH)
    app.start_setup(environment_id)
    retried = app.environment(environment_id).setup_operation_id
    assert retried != operation
    assert app.recorded_hook(retried).awaited
    assert not app.recorded_hook(operation).awaited  # the earlier attempt stays known, and finished


def test_a_running_teardown_runs_to_its_end_and_then_the_removed_environment_awaits_nothing(app):
    environment_id = provisioning(app)
    app.start_setup(environment_id)
    app.record_setup_outcome(environment_id, app.environment(environment_id).setup_operation_id, True, None)
    app.archive_thread("t1", NOW)
    app.start_removal(environment_id, NOW)
    app.start_teardown(environment_id)
    operation = app.environment(environment_id).teardown_operation_id

    teardown = app.recorded_hook(operation)
    assert (teardown.kind, teardown.workspace, teardown.awaited, teardown.stoppable) == ("teardown", PATH, True, False)

    app.record_teardown_outcome(environment_id, operation, "succeeded", None)
    app.record_removed(environment_id, 1)
    removed = app.recorded_hook(operation)
    assert not removed.awaited and removed.workspace is None
