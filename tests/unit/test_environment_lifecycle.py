"""The lifecycle rules, checked on the aggregates alone: no NATS, no disk (in-memory store)."""

from datetime import UTC, datetime, timedelta

import pytest

from bb_environments.domain.errors import IllegalTransition, PathAlreadyClaimed, ThreadsStillLive
from bb_environments.entrypoints.bootstrap import AGGREGATE_CACHE
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.projections.views import environment_view

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(params=[{}, AGGREGATE_CACHE], ids=["uncached", "cached as bb serve"])
def app(request):
    # Cached, a refused command must leave the aggregates it changed before refusing as the log has them.
    application = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo", **request.param}, grace_for=lambda _: 0)
    yield application
    application.close()


def spawn(app, thread_id="t1", path="/data/worktrees/t1/repo"):
    app.register_thread(thread_id, "/repo", None, "local", None)
    return app.claim_environment(thread_id, "git-worktree", "local", "/repo", {}, thread_id, path)


def names(app, environment_id):
    return [type(e).__name__ for e in app.events.get(environment_id)]


def make_ready(app, env):
    app.record_created(env.id, 1, env.claimed_path, True, "main", None)
    app.start_setup(env.id)
    operation = app.environment(env.id).setup_operation_id
    return app.record_setup_outcome(env.id, operation, True, None)


def test_happy_path_walks_every_status_in_order(app):
    env = spawn(app)
    assert app.environment(env.id).status == "creating"
    assert make_ready(app, env).status == "ready"
    assert app.archive_thread("t1", NOW).public_status == "retiring"
    app.start_removal(env.id, NOW)
    app.start_teardown(env.id)
    removing = app.environment(env.id)
    app.record_teardown_outcome(env.id, removing.teardown_operation_id, "succeeded", None)
    assert app.record_removed(env.id, 1).status == "removed"
    assert names(app, env.id) == [
        "Claimed",
        "Created",
        "SetupStarted",
        "SetupSucceeded",
        "Ready",
        "ThreadDetached",
        "RetireScheduled",
        "RemovalStarted",
        "TeardownStarted",
        "TeardownFinished",
        "Removed",
    ]


def test_a_claimed_path_cannot_be_claimed_again_and_nothing_is_written(app):
    spawn(app, "t1", "/data/p")
    app.register_thread("t2", "/repo", None, "local", None)
    head = app.head()
    with pytest.raises(PathAlreadyClaimed):
        app.claim_environment("t2", "git-worktree", "local", "/repo", {}, "t2", "/data/p")
    assert app.head() == head
    assert app.thread("t2").environment_id is None


def new_thread(thread_id):
    """A new thread's registration, as spawn_thread takes it: id, project, parent, host, intent."""
    return thread_id, "/repo", None, "local", None


def test_a_spawned_thread_is_saved_with_its_environment_or_not_at_all(app):
    held = spawn(app, "t1", "/data/p")
    cancelled = spawn(app, "t0", "/data/c")
    app.archive_thread("t0", NOW)
    head = app.head()
    with pytest.raises(PathAlreadyClaimed):
        app.spawn_thread(*new_thread("t2"), Placement("git-worktree", "local", "/repo", {}, "t2", "/data/p/sub"))
    with pytest.raises(IllegalTransition, match="takes no new threads"):
        app.spawn_thread(*new_thread("t2"), cancelled.id)
    assert app.head() == head and app.find_thread("t2") is None

    placed = app.spawn_thread(*new_thread("t2"), Placement("git-worktree", "local", "/repo", {}, "t2", "/data/q"))
    joined = app.spawn_thread(*new_thread("t3"), held.id)

    assert app.thread("t2").environment_id == placed.id and placed.claimed_path == "/data/q"
    assert joined.id == held.id and app.environment(held.id).thread_ids == ["t1", "t3"]
    with pytest.raises(IllegalTransition, match="already exists"):
        app.spawn_thread(*new_thread("t3"), held.id)


def share(app, thread_id, provider_id="project-checkout", path="/repo"):
    app.register_thread(thread_id, "/repo", None, "local", None)
    return app.claim_environment(thread_id, provider_id, "local", "/repo", {}, thread_id, path, True)


def test_a_sharing_request_joins_the_live_holder_of_its_path_and_only_that(app):
    first = share(app, "t1")
    assert share(app, "t2").id == first.id
    assert app.environment(first.id).thread_ids == ["t1", "t2"]
    assert app.thread("t2").environment_id == first.id
    with pytest.raises(PathAlreadyClaimed):  # another provider's environment is never joined
        share(app, "t3", provider_id="git-worktree")


def test_a_sharing_request_does_not_join_a_holder_in_error(app):
    first = share(app, "t1")
    app.record_create_failed(first.id, 1, "terminal", "boom")
    head = app.head()
    with pytest.raises(PathAlreadyClaimed):
        share(app, "t2")
    assert app.thread("t2").environment_id is None
    assert app.head() == head + 1  # only t2's registration


def switch(app, thread_id, path="/repo"):
    app.register_thread(thread_id, "/repo", None, "local", None)
    return app.claim_environment(thread_id, "project-checkout", "local", "/repo", {}, thread_id, path)


def test_an_idle_holder_that_does_not_own_the_path_gives_it_up_to_a_new_environment(app):
    idle = share(app, "t1")
    app.record_created(idle.id, 1, "/repo", False, "main", None)
    app.skip_setup(idle.id, "the provider does not own the path")
    app.archive_thread("t1", NOW)

    replacing = switch(app, "t2")

    assert replacing.id != idle.id
    assert app.environment(idle.id).status == "removing"
    app.skip_teardown(idle.id, "not owned")
    app.record_removed(idle.id, 1)
    with pytest.raises(PathAlreadyClaimed, match=str(replacing.id)):  # the new one holds it, even now
        switch(app, "t3")


def test_a_holder_with_threads_or_its_own_path_keeps_it(app):
    busy = share(app, "t1")
    app.record_created(busy.id, 1, "/repo", False, "main", None)
    app.skip_setup(busy.id, "the provider does not own the path")
    with pytest.raises(PathAlreadyClaimed):
        switch(app, "t2")
    owner = share(app, "o1", path="/elsewhere")
    make_ready(app, app.record_created(owner.id, 1, "/elsewhere", True, "main", None))
    app.archive_thread("o1", NOW)
    with pytest.raises(PathAlreadyClaimed):
        switch(app, "o2", path="/elsewhere")
    assert app.environment(busy.id).status == app.environment(owner.id).status == "ready"


def test_a_path_inside_or_around_a_claimed_path_is_refused(app):
    spawn(app, "t1", "/data/p")
    for i, path in enumerate(["/data/p/sub", "/data", "/"]):
        app.register_thread(f"x{i}", "/repo", None, "local", None)
        with pytest.raises(PathAlreadyClaimed, match="overlaps"):
            app.claim_environment(f"x{i}", "git-worktree", "local", "/repo", {}, f"x{i}", path)
    app.register_thread("y", "/repo", None, "local", None)
    assert app.claim_environment("y", "git-worktree", "local", "/repo", {}, "y", "/data/pp")
    app.register_thread("z", "/repo", None, "other-host", None)
    assert app.claim_environment("z", "git-worktree", "other-host", "/repo", {}, "z", "/data/p/sub")


def test_the_claim_is_free_again_once_removed(app):
    env = spawn(app, "t1", "/data/p")
    make_ready(app, env)
    app.archive_thread("t1", NOW)
    app.start_removal(env.id, NOW)
    app.skip_teardown(env.id, "test")
    app.record_removed(env.id, 1)
    app.register_thread("t2", "/repo", None, "local", None)
    assert app.claim_environment("t2", "git-worktree", "local", "/repo", {}, "t2", "/data/p").status == "creating"


def test_a_late_or_repeated_create_answer_changes_nothing(app):
    env = spawn(app)
    app.record_created(env.id, 1, env.claimed_path, True, None, None)
    version = app.environment(env.id).version
    app.record_created(env.id, 1, env.claimed_path, True, None, None)
    app.record_create_failed(env.id, 1, "terminal", "late")
    app.record_created(env.id, 7, env.claimed_path, True, None, None)
    assert app.environment(env.id).version == version


def test_setup_failure_is_an_error_and_retry_reruns_only_setup(app):
    env = spawn(app)
    app.record_created(env.id, 1, env.claimed_path, True, None, None)
    app.start_setup(env.id)
    first = app.environment(env.id).setup_operation_id
    failed = app.record_setup_outcome(env.id, first, False, "setup failed with exit code 3")
    assert (failed.status, failed.status_message) == ("error", "setup failed with exit code 3")
    app.retry(env.id, env.path_key, env.claimed_path)
    app.start_setup(env.id)
    retried = app.environment(env.id)
    assert retried.setup_operation_id != first
    assert retried.attempt == 1 and retried.path == env.claimed_path
    assert app.record_setup_outcome(env.id, first, True, None).status == "provisioning"


def test_create_failure_retry_starts_the_next_attempt(app):
    env = spawn(app)
    app.record_create_failed(env.id, 1, "terminal", "no such branch")
    with pytest.raises(IllegalTransition, match="cleaned up"):
        app.retry(env.id, "t1-2", "/data/t1-2")
    app.record_attempt_cleaned(env.id, 1)
    retried = app.retry(env.id, "t1-2", "/data/t1-2")
    assert (retried.status, retried.attempt, retried.path_key) == ("creating", 2, "t1-2")
    app.register_thread("t2", "/repo", None, "local", None)
    # the old attempt's path is free again, the new one is held
    assert app.claim_environment("t2", "git-worktree", "local", "/repo", {}, "t2", env.claimed_path)
    app.register_thread("t3", "/repo", None, "local", None)
    with pytest.raises(PathAlreadyClaimed):
        app.claim_environment("t3", "git-worktree", "local", "/repo", {}, "t3", "/data/t1-2")


def test_transient_failures_retry_automatically_a_bounded_number_of_times(app):
    env = spawn(app)
    for attempt in (1, 2, 3, 4):
        app.record_create_failed(env.id, attempt, "transient", "lock busy")
        assert not app.environment(env.id).retries_automatically(3)  # not before cleanup
        app.record_attempt_cleaned(env.id, attempt)
        if attempt < 4:
            assert app.environment(env.id).retries_automatically(3)
            app.retry(env.id, env.path_key, env.claimed_path)
    assert not app.environment(env.id).retries_automatically(3)


def test_a_terminal_failure_is_never_retried_automatically(app):
    env = spawn(app)
    app.record_create_failed(env.id, 1, "terminal", "bad branch")
    app.record_attempt_cleaned(env.id, 1)
    assert not app.environment(env.id).retries_automatically(3)


def test_retry_is_refused_unless_in_error(app):
    env = spawn(app)
    with pytest.raises(IllegalTransition):
        app.retry(env.id, env.path_key, env.claimed_path)
    make_ready(app, env)
    version = app.environment(env.id).version
    with pytest.raises(IllegalTransition):
        app.retry(env.id, env.path_key, env.claimed_path)
    assert app.environment(env.id).version == version


def test_setup_is_skipped_for_paths_the_provider_does_not_own(app):
    env = spawn(app)
    head = app.head()
    ready = app.record_created(env.id, 1, "/elsewhere", False, None, None)
    assert (ready.status, ready.setup_status) == ("ready", "skipped")
    assert names(app, env.id) == ["Claimed", "Created", "SetupSkipped", "Ready"]
    assert app.head() == head + 4  # Created, SetupSkipped, Ready and the claim of /elsewhere: one save
    assert app.skip_setup(env.id, "not owned").version == ready.version


def test_created_and_setup_started_are_one_save(app):
    """The setup of a workspace the provider owns starts in the save that records it: no second
    transaction, and nothing for a crash to find in between."""
    env = spawn(app)
    head = app.head()
    started = app.record_created(env.id, 1, env.claimed_path, True, "main", None)
    assert (started.status, started.setup_status) == ("provisioning", "running")
    assert started.setup_operation_id == f"{env.id}.setup.1.1"
    assert names(app, env.id) == ["Claimed", "Created", "SetupStarted"]
    assert app.head() == head + 2
    assert not app.start_setup(env.id)[1]


def test_a_workspace_made_empty_is_ready_with_its_creation_and_runs_no_setup(app):
    """A provider that made the path just now and put nothing in it: no setup script can be there,
    so no hook operation is started for the host to look; the teardown still runs as usual."""
    env = spawn(app)
    head = app.head()
    ready = app.record_created(env.id, 1, env.claimed_path, True, None, None, empty=True)
    assert (ready.status, ready.setup_status, ready.setup_operation_id) == ("ready", "skipped", None)
    assert names(app, env.id) == ["Claimed", "Created", "SetupSkipped", "Ready"]
    assert app.head() == head + 3
    app.archive_thread("t1", NOW)
    app.start_removal(env.id, NOW)
    assert app.start_teardown(env.id)[1]


def test_a_started_hook_the_host_skips_is_recorded_as_skipped(app):
    env = spawn(app)
    app.record_created(env.id, 1, env.claimed_path, True, None, None)
    app.start_setup(env.id)
    operation = app.environment(env.id).setup_operation_id
    version = app.environment(env.id).version
    assert app.record_setup_skipped(env.id, f"{operation}-stale", "no .bb-env-setup.sh").version == version
    skipped = app.record_setup_skipped(env.id, operation, "no .bb-env-setup.sh")
    assert (skipped.status, skipped.setup_status) == ("ready", "skipped")
    app.archive_thread("t1", NOW)
    app.start_removal(env.id, NOW)
    app.start_teardown(env.id)
    teardown = app.environment(env.id).teardown_operation_id
    assert app.record_teardown_skipped(env.id, teardown, "no .bb-env-teardown.sh").teardown_status == "skipped"
    assert app.record_teardown_skipped(env.id, teardown, "again").version == app.environment(env.id).version
    assert names(app, env.id) == [
        "Claimed",
        "Created",
        "SetupStarted",
        "SetupSkipped",
        "Ready",
        "ThreadDetached",
        "RetireScheduled",
        "RemovalStarted",
        "TeardownStarted",
        "TeardownSkipped",
    ]


def test_a_setup_skipped_after_a_cancel_does_not_make_it_ready(app):
    env = spawn(app)
    app.record_created(env.id, 1, env.claimed_path, True, None, None)
    app.start_setup(env.id)
    app.cancel_thread_message("t1")
    skipped = app.record_setup_skipped(env.id, app.environment(env.id).setup_operation_id, "no .bb-env-setup.sh")
    assert (skipped.status, skipped.setup_status, skipped.cancelled) == ("provisioning", "skipped", True)
    assert app.start_removal(env.id, NOW)[1]


def test_a_shared_environment_retires_only_after_its_last_thread(app):
    env = spawn(app)
    make_ready(app, env)
    app.register_thread("t2", "/repo", None, "local", None)
    app.attach_thread("t2", env.id)
    assert app.archive_thread("t1", NOW).public_status == "ready"
    assert app.archive_thread("t2", NOW).public_status == "retiring"
    assert app.unarchive_thread("t2").public_status == "ready"


def test_a_thread_that_leaves_and_joins_again_is_placed_again_at_a_later_version(app):
    env = spawn(app)
    make_ready(app, env)
    app.register_thread("t2", "/repo", None, "local", None)
    app.attach_thread("t2", env.id)
    assert app.environment(env.id).joined_at == {"t1": 1, "t2": attached_versions(app, env.id)[0]}
    app.archive_thread("t2", NOW)
    assert app.environment(env.id).joined_at == {"t1": 1}
    app.unarchive_thread("t2")
    first, again = attached_versions(app, env.id)
    assert again > first and app.environment(env.id).joined_at == {"t1": 1, "t2": again}


def attached_versions(app, environment_id):
    return [e.originator_version for e in app.events.get(environment_id) if type(e).__name__ == "ThreadAttached"]


def test_only_a_failure_the_environment_does_not_retry_by_itself_is_one_for_good(app):
    env = spawn(app)
    for attempt in (1, 2, 3, 4):
        app.record_create_failed(env.id, attempt, "transient", "lock busy")
        assert app.environment(env.id).failed_for_good == (attempt == 4)
        app.record_attempt_cleaned(env.id, attempt)
        if attempt < 4:
            app.retry(env.id, env.path_key, env.claimed_path)
    terminal = spawn(app, "t2", "/data/worktrees/t2/repo")
    app.record_create_failed(terminal.id, 1, "terminal", "bad branch")
    assert app.environment(terminal.id).failed_for_good
    assert not make_ready(app, spawn(app, "t3", "/data/worktrees/t3/repo")).failed_for_good


def test_deletion_is_refused_while_threads_live_and_skips_grace_otherwise(app):
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: None)
    env = spawn(app)
    make_ready(app, env)
    with pytest.raises(ThreadsStillLive):
        app.request_deletion(env.id)
    app.archive_thread("t1", NOW)
    assert app.environment(env.id).retire_at is None  # never retires by itself
    app.request_deletion(env.id)
    assert app.start_removal(env.id, NOW)[1]


def test_deleting_a_retiring_environment_skips_the_rest_of_its_grace(app):
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 600_000)
    env = spawn(app)
    make_ready(app, env)
    assert app.archive_thread("t1", NOW).public_status == "retiring"
    assert not app.start_removal(env.id, NOW)[1]  # the grace has not passed

    app.request_deletion(env.id)
    head = app.head()
    app.request_deletion(env.id)  # a second delete changes nothing more

    assert app.head() == head
    assert app.start_removal(env.id, NOW)[1]
    assert app.environment(env.id).status == "removing"


def test_deleting_a_removed_environment_changes_nothing_and_is_no_error(app):
    env = spawn(app)
    make_ready(app, env)
    app.archive_thread("t1", NOW)
    app.request_deletion(env.id)
    app.start_removal(env.id, NOW)
    assert app.request_deletion(env.id).status == "removing"  # under way already
    app.skip_teardown(env.id, "none")
    app.record_removed(env.id, app.environment(env.id).removal_attempt)
    head = app.head()

    assert app.request_deletion(env.id).status == "removed"
    assert app.head() == head


def test_archiving_while_creating_cancels_and_removal_follows(app):
    env = spawn(app)
    cancelled = app.archive_thread("t1", NOW)
    assert cancelled.cancelled and cancelled.status == "creating"
    app.record_created(env.id, 1, env.claimed_path, True, None, None)
    assert not app.start_setup(env.id)[1]
    assert app.start_removal(env.id, NOW)[1]


def test_message_cancelled_stops_preparation_and_frees_the_thread(app):
    env = spawn(app)
    assert app.cancel_thread_message("t1").id == env.id
    assert app.environment(env.id).cancelled
    assert app.thread("t1").environment_id is None


def test_a_failed_removal_is_retried_after_its_deadline(app):
    env = spawn(app)
    make_ready(app, env)
    app.archive_thread("t1", NOW)
    app.start_removal(env.id, NOW)
    app.skip_teardown(env.id, "test")
    app.record_remove_failed(env.id, 1, "busy", NOW + timedelta(seconds=60))
    assert not app.start_removal(env.id, NOW)[1]
    assert app.start_removal(env.id, NOW + timedelta(seconds=61))[1]
    assert app.record_removed(env.id, 2).status == "removed"


def test_unfinished_environments_are_found_for_recovery(app):
    done, live = spawn(app, "t1", "/a"), spawn(app, "t2", "/b")
    app.record_create_failed(done.id, 1, "terminal", "x")
    app.archive_thread("t1", NOW)
    app.start_removal(done.id, NOW)
    app.skip_teardown(done.id, "x")
    app.record_removed(done.id, 1)
    assert app.unfinished_environment_ids() == [live.id]


def test_work_saved_at_removal_is_recorded_before_the_removal_and_shown_on_the_environment(app):
    env = spawn(app)
    make_ready(app, env)
    app.archive_thread("t1", NOW)
    app.start_removal(env.id, NOW)
    app.skip_teardown(env.id, "no teardown to run")

    removed = app.record_removed(env.id, 1, f"refs/bb/saved/{env.id}")
    again = app.record_removed(env.id, 1, f"refs/bb/saved/{env.id}")  # a redelivered answer

    assert removed.status == "removed" and removed.saved_ref == f"refs/bb/saved/{env.id}"
    assert names(app, env.id)[-2:] == ["WorkSaved", "Removed"]
    assert names(app, env.id).count("WorkSaved") == 1 and again.version == removed.version
    assert environment_view(app.environment(env.id)).saved_ref == f"refs/bb/saved/{env.id}"


def test_a_removal_that_saved_nothing_records_no_saved_work(app):
    env = spawn(app)
    make_ready(app, env)
    app.archive_thread("t1", NOW)
    app.start_removal(env.id, NOW)
    app.skip_teardown(env.id, "no teardown to run")

    assert app.record_removed(env.id, 1).saved_ref is None
    assert "WorkSaved" not in names(app, env.id)
    assert environment_view(app.environment(env.id)).saved_ref is None


def test_a_resume_is_asked_in_the_log_once_per_pause_and_only_while_paused(app):
    env = make_ready(app, spawn(app))
    app.request_resume(env.id)  # running: nothing to resume
    app.record_paused(env.id, {"snapshot": "s1"}, NOW)
    app.request_resume(env.id)
    app.request_resume(env.id)  # a second message before the resume: asked already
    app.record_resumed(env.id, {"sandbox": "sb-2"})
    app.request_resume(env.id)

    assert names(app, env.id)[-3:] == ["Paused", "ResumeRequested", "Resumed"]
    assert not app.environment(env.id).resume_requested
