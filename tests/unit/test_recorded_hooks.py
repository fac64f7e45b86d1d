"""What the log tells a host agent about a hook operation id (the ledger behind its guard), and
which hook records it lets a host delete (real hooks, real record files)."""

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bb_environments.domain.hook_operations import RecordedHook
from bb_environments.handlers.application import Environments
from bb_environments.hooks.ledger import HookGuard, HookRefused
from bb_environments.hooks.records import HookRecords
from bb_environments.hooks.runner import HookRunner
from tests.unit.test_hooks import Output, executions, wait_until, write_setup

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PATH = "/data/worktrees/t1/repo"


@pytest.fixture
def app():
    application = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 0)
    yield application
    application.close()


def provisioning(app, thread_id="t1", path=PATH):
    app.register_thread(thread_id, "/repo", None, "local", None)
    environment = app.claim_environment(thread_id, "git-worktree", "local", "/repo", {}, thread_id, path)
    app.record_created(environment.id, 1, path, True, "main", None)
    return environment.id


def test_an_operation_the_log_never_started_is_unknown_whatever_it_looks_like(app):
    app.register_thread("t1", "/repo", None, "local", None)
    environment_id = app.claim_environment("t1", "git-worktree", "local", "/repo", {}, "t1", PATH).id
    assert app.recorded_hook("forged") is None
    assert app.recorded_hook(f"{environment_id}.setup.1.1") is None  # the id setup would get, not yet started
    assert app.recorded_hook(f"{environment_id}.teardown") is None


def test_a_running_setup_may_run_in_its_recorded_path_and_may_not_be_stopped(app):
    environment_id = provisioning(app)
    app.start_setup(environment_id)
    operation = app.environment(environment_id).setup_operation_id

    assert app.recorded_hook(operation) == RecordedHook(
        operation_id=operation,
        environment_id=str(environment_id),
        kind="setup",
        host_id="local",
        workspace=PATH,
        awaited=True,
        stoppable=False,
        environment_removed=False,
        slug=app.environment(environment_id).slug,
        ports="20000-20009",
    )
    assert app.recorded_hook(operation).given_variables() == {
        "BB_ENVIRONMENT_ID": str(environment_id),
        "BB_ENVIRONMENT_SLUG": app.environment(environment_id).slug,
        "BB_PORT": "20000",
        "BB_PORTS": "20000-20009",
    }


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
    assert not teardown.environment_removed

    app.record_teardown_outcome(environment_id, operation, "succeeded", None)
    app.record_removed(environment_id, 1)
    removed = app.recorded_hook(operation)
    assert not removed.awaited and removed.workspace is None and removed.environment_removed


def test_the_environment_a_command_returns_answers_for_its_current_hook_as_the_log_does(app):
    # What the core hands the agent in its own process instead of a second read of the log.
    environment_id = provisioning(app)
    started = app.start_setup(environment_id)[0]
    operation = started.setup_operation_id
    assert started.current_hook(operation) == app.recorded_hook(operation)
    assert started.current_hook("forged") is None

    failed = app.record_setup_outcome(environment_id, operation, False, "boom")
    assert failed.current_hook(operation) == app.recorded_hook(operation)
    assert not failed.current_hook(operation).awaited

    app.retry(environment_id, "t1", PATH)
    retried = app.start_setup(environment_id)[0]
    assert retried.current_hook(retried.setup_operation_id) == app.recorded_hook(retried.setup_operation_id)
    # An earlier attempt's operation: only the log's index knows it, so the agent asks the log.
    assert retried.current_hook(operation) is None

    app.record_setup_outcome(environment_id, retried.setup_operation_id, True, None)
    app.archive_thread("t1", NOW)
    app.start_removal(environment_id, NOW)
    torn = app.start_teardown(environment_id)[0]
    assert torn.current_hook(torn.teardown_operation_id) == app.recorded_hook(torn.teardown_operation_id)


def test_the_current_hook_stays_the_log_s_answer_through_a_cancel_and_after_removal(app):
    environment_id = provisioning(app)
    setup = app.start_setup(environment_id)[0].setup_operation_id
    archived = app.archive_thread("t1", NOW)  # the last thread leaves while the setup runs
    assert archived.current_hook(setup) == app.recorded_hook(setup)
    assert archived.current_hook(setup).awaited and archived.current_hook(setup).stoppable

    app.record_setup_outcome(environment_id, setup, False, "cancelled")
    app.start_removal(environment_id, NOW)
    teardown = app.start_teardown(environment_id)[0].teardown_operation_id
    app.record_teardown_outcome(environment_id, teardown, "succeeded", None)
    removed = app.record_removed(environment_id, 1)
    for operation in (setup, teardown):
        assert removed.current_hook(operation) == app.recorded_hook(operation)
        assert removed.current_hook(operation).environment_removed


class NoLedger:
    """A ledger the guard must not need: the core handed it the log's answer."""

    async def recorded_hook(self, operation_id):
        raise AssertionError("a known answer is not asked of the ledger again")

    async def hook_secrets(self, operation_id, host_id):
        return {}


async def test_the_guard_starts_an_awaited_known_hook_without_asking_the_ledger(app):
    environment_id = provisioning(app)
    started = app.start_setup(environment_id)[0]
    operation = started.setup_operation_id
    known = started.current_hook(operation)

    guard = HookGuard(NoLedger(), "local")
    assert await guard.to_run(operation, "setup", str(environment_id), PATH, known) == known


@pytest.mark.parametrize(
    "asked",
    [{"kind": "teardown"}, {"environment_id": "another"}, {"workspace": "/data/worktrees/t2/repo"}],
    ids=["kind", "environment", "workspace"],
)
async def test_the_guard_refuses_a_known_hook_asked_for_as_another_as_it_refuses_the_log_s(app, asked):
    environment_id = provisioning(app)
    started = app.start_setup(environment_id)[0]
    operation = started.setup_operation_id
    request = {"kind": "setup", "environment_id": str(environment_id), "workspace": PATH} | asked

    with pytest.raises(HookRefused, match="the log recorded the setup hook") as by_the_log:
        await HookGuard(LogLedger(app), "local").to_run(operation, **request)
    with pytest.raises(HookRefused) as by_the_known:
        await HookGuard(NoLedger(), "local").to_run(operation, **request, known=started.current_hook(operation))
    assert by_the_known.value.reason == by_the_log.value.reason


async def test_the_guard_refuses_a_known_answer_as_it_refuses_the_log_s(app):
    environment_id = provisioning(app)
    operation = app.start_setup(environment_id)[0].setup_operation_id
    done = app.record_setup_outcome(environment_id, operation, True, None)

    guard = HookGuard(NoLedger(), "local")
    with pytest.raises(HookRefused, match="awaits no outcome"):
        await guard.to_run(operation, "setup", str(environment_id), PATH, done.current_hook(operation))
    with pytest.raises(HookRefused, match="belongs to host 'local'"):
        await HookGuard(NoLedger(), "elsewhere").to_run(
            operation, "setup", str(environment_id), PATH, app.recorded_hook(operation)
        )


class LogLedger:
    """The ledger of an agent beside the store, without the store's writer thread."""

    def __init__(self, app: Environments) -> None:
        self._app = app

    async def recorded_hook(self, operation_id: str) -> RecordedHook | None:
        return self._app.recorded_hook(operation_id)

    async def hook_secrets(self, operation_id: str, host_id: str) -> dict[str, str]:
        return {}


@pytest.fixture
def records_dir(tmp_path):
    return tmp_path / "hook-records"


@pytest.fixture
def runner(records_dir):
    hooks = HookRunner(records_dir, 60)
    yield hooks
    hooks.close()


@pytest.fixture
def workspace(tmp_path):
    path = tmp_path / "workspace"
    path.mkdir()
    write_setup(path, "echo ran >> marker; echo set up\n")
    (path / ".bb-env-teardown.sh").write_text("echo torn down\n")
    return path


def record_files(records_dir: Path) -> list[str]:
    return sorted(p.suffix for p in records_dir.rglob("*") if p.is_file())


async def set_up(app, runner, workspace, thread_id, path):
    """An environment whose setup hook ran here and whose outcome the log recorded."""
    environment_id = provisioning(app, thread_id, path)
    app.start_setup(environment_id)
    operation = app.environment(environment_id).setup_operation_id
    outcome = await runner.run(operation, "setup", workspace, Output())
    app.record_setup_outcome(environment_id, operation, outcome.status == "succeeded", outcome.message)
    return environment_id, operation


async def remove(app, runner, workspace, environment_id, thread_id):
    """Archived and removed, its teardown hook run here; returns the teardown's operation id."""
    app.archive_thread(thread_id, NOW)
    app.start_removal(environment_id, NOW)
    app.start_teardown(environment_id)
    operation = app.environment(environment_id).teardown_operation_id
    outcome = await runner.run(operation, "teardown", workspace, Output())
    app.record_teardown_outcome(environment_id, operation, outcome.status, outcome.message)
    app.record_removed(environment_id, 1)
    return operation


async def test_a_removed_environment_s_hook_records_go_once_older_than_the_limit_and_a_live_one_s_stay(
    app, runner, workspace, records_dir
):
    removed_id, removed_setup = await set_up(app, runner, workspace, "t1", "/data/a")
    removed_teardown = await remove(app, runner, workspace, removed_id, "t1")
    # Cancelled before its setup ever started here: only a tombstone.
    never_ran_id = provisioning(app, "t2", "/data/b")
    app.start_setup(never_ran_id)
    never_ran = app.environment(never_ran_id).setup_operation_id
    assert await runner.cancel(never_ran) == "never-started"
    app.archive_thread("t2", NOW)
    app.record_setup_outcome(never_ran_id, never_ran, False, "cancelled")
    app.start_removal(never_ran_id, NOW)
    app.skip_teardown(never_ran_id, "no teardown")
    app.record_removed(never_ran_id, 1)
    _live_id, live_setup = await set_up(app, runner, workspace, "t3", "/data/c")
    guard = HookGuard(LogLedger(app), "local")
    assert len(record_files(records_dir)) == 7  # three records and their logs, one tombstone

    assert await guard.forget_removed(runner, max_age_s=3600) == []
    assert len(record_files(records_dir)) == 7

    forgotten = await guard.forget_removed(runner, max_age_s=0)

    assert sorted(forgotten) == sorted([removed_setup, removed_teardown, never_ran])
    assert record_files(records_dir) == [".json", ".log"]
    assert runner.status(removed_setup) is None and runner.status(removed_teardown) is None
    assert runner.status(live_setup).outcome == "succeeded"
    assert (await runner.run(live_setup, "setup", workspace, Output())).status == "succeeded"
    assert executions(workspace) == 2  # replayed, not run again


async def test_a_hook_still_running_keeps_its_record_though_its_environment_is_removed(
    app, runner, workspace, records_dir
):
    environment_id = provisioning(app)
    app.start_setup(environment_id)
    operation = app.environment(environment_id).setup_operation_id
    write_setup(workspace, "until [ -e release ]; do sleep 0.01; done; echo released\n")
    running = asyncio.ensure_future(runner.run(operation, "setup", workspace, Output()))
    await wait_until(lambda: (record := runner.status(operation)) is not None and record.script_pid is not None)
    app.archive_thread("t1", NOW)  # cancelled while its setup runs: the log stops waiting for it
    app.record_setup_outcome(environment_id, operation, False, "cancelled")
    app.start_removal(environment_id, NOW)
    app.skip_teardown(environment_id, "no teardown")
    app.record_removed(environment_id, 1)
    guard = HookGuard(LogLedger(app), "local")

    assert await guard.forget_removed(runner, max_age_s=0) == []
    (workspace / "release").touch()
    assert (await running).status == "succeeded"
    assert await guard.forget_removed(runner, max_age_s=0) == [operation]
    assert record_files(records_dir) == []


async def test_a_deletion_cut_short_leaves_a_record_that_still_replays_and_goes_next_time(
    app, runner, workspace, records_dir
):
    environment_id, setup = await set_up(app, runner, workspace, "t1", PATH)
    await remove(app, runner, workspace, environment_id, "t1")
    # What a kill -9 between deletion's two steps leaves: logs and tombstones gone, records not.
    for log_file in records_dir.glob("*/*.log"):
        log_file.unlink()
    restarted = HookRunner(records_dir, 60)
    try:
        output = Output()
        assert (await restarted.run(setup, "setup", workspace, output)).status == "succeeded"
        assert output.lines == [] and executions(workspace) == 1

        assert len(await HookGuard(LogLedger(app), "local").forget_removed(restarted, max_age_s=0)) == 2
        assert record_files(records_dir) == []
    finally:
        restarted.close()


async def test_files_in_the_records_directory_that_are_no_operation_s_own_are_left_alone(
    app, runner, workspace, records_dir
):
    environment_id, setup = await set_up(app, runner, workspace, "t1", PATH)
    await remove(app, runner, workspace, environment_id, "t1")
    [record] = [p for p in records_dir.glob("*/*.json") if b'"kind": "setup"' in p.read_bytes()]
    strangers = {"0" * 64 + ".json": record.read_bytes(), "notes.json": b"{", "list.cancelled": b"[]"}
    for name, data in strangers.items():
        (records_dir / name).write_bytes(data)

    assert setup in await HookGuard(LogLedger(app), "local").forget_removed(runner, max_age_s=0)
    assert sorted(p.name for p in records_dir.iterdir()) == sorted(strangers)


async def test_a_record_write_a_crash_cut_short_is_deleted_once_older_than_the_limit(app, runner, records_dir):
    # What a kill -9 between creating a record's temporary file and renaming it leaves.
    abandoned, in_progress = records_dir / ".tmp-abandoned", records_dir / ".tmp-in-progress"
    abandoned.write_bytes(b'{"operation_id": "op-1"')
    in_progress.write_bytes(b"{")
    two_hours_ago = time.time() - 7200
    os.utime(abandoned, (two_hours_ago, two_hours_ago))

    await HookGuard(LogLedger(app), "local").forget_removed(runner, max_age_s=3600)

    assert sorted(p.name for p in records_dir.iterdir()) == [".tmp-in-progress"]


def test_a_record_a_power_loss_left_empty_reads_as_no_record(records_dir):
    records = HookRecords(records_dir)
    record = records._record_path("op-1")
    record.parent.mkdir()
    record.write_bytes(b"")  # renamed in, its data never reached the disk

    assert records.read("op-1") is None
