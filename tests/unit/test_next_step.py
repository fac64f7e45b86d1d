"""The aggregate decides what happens next: every status × situation, no asyncio, no NATS.

Each case builds an Environment through its command methods only, asks `next_step(now)` and
checks the step. The driver (handlers/provisioning.py) executes whatever this table says.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest

from bb_environments.domain.environment import TRANSIENT_RETRIES, Environment
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.domain.steps import (
    BindMember,
    CancelSetup,
    CleanAttempt,
    PauseWhenIdle,
    Remove,
    Resume,
    ResumeOnActivity,
    RetryRemoval,
    RetryTransient,
    RunCreate,
    RunSetup,
    RunTeardown,
    Settled,
    SkipSetup,
    SkipTeardown,
    StartRemoval,
    StartSetup,
    StartTeardown,
    Step,
    StopCreate,
    WakeAt,
)

GRACE_MS = 300_000
GRACE = timedelta(milliseconds=GRACE_MS)
RETRY_DELAY = timedelta(seconds=30)
REMOVE_RETRY = timedelta(seconds=60)


def now() -> datetime:
    return datetime.now(UTC)


# -- environments, built through their commands ------------------------------------------------


def claimed() -> Environment:
    return Environment(
        provider_id="git-worktree",
        host_id="local",
        project_path="/repo",
        inputs={},
        path_key="t1",
        claimed_path="/data/t1",
        thread_id="t1",
    )


def cancelled_while_creating() -> Environment:
    env = claimed()
    env.detach_thread("t1", now(), GRACE_MS)
    return env


def created(owns_path: bool = True) -> Environment:
    env = claimed()
    env.record_created(1, "/data/t1", owns_path, "main", None)
    return env


def cancelled(env: Environment) -> Environment:
    env.cancel_for_thread("t1")
    return env


def setting_up() -> Environment:
    env = created()
    env.start_setup(env.setup_operation())
    return env


def ready(owns_path: bool = True) -> Environment:
    env = created(owns_path)
    if owns_path:
        env.start_setup(env.setup_operation())
        env.record_setup_outcome(env.setup_operation_id, True, None)
    else:
        env.skip_setup("the provider does not own the path")
    return env


def pooled_member() -> Environment:
    """A warm pool's member, set up with no thread (SPEC 10)."""
    env = Environment(
        provider_id="git-worktree",
        host_id="local",
        project_path="/repo",
        inputs={},
        path_key="pool-1",
        claimed_path="/data/pool-1",
        thread_id="",
        pool_id="p1",
        base_commit="c1",
        setup_hash=None,
    )
    env.record_created(1, "/data/pool-1", True, "main", {"branch": "bb/pool-1"})
    env.start_setup(env.setup_operation())
    env.record_setup_outcome(env.setup_operation_id, True, None)
    return env


def bound_member() -> Environment:
    env = pooled_member()
    env.bind("t1", {}, "t1")
    return env


def bound_member_renamed() -> Environment:
    env = bound_member()
    env.record_bound({"branch": "bb/t1"})
    return env


def bound_member_not_renamed() -> Environment:
    env = bound_member()
    env.record_bind_failed("branch exists")
    return env


def setup_failed() -> Environment:
    env = setting_up()
    env.record_setup_outcome(env.setup_operation_id, False, "setup failed with exit code 3")
    return env


def setup_retried() -> Environment:
    env = setup_failed()
    env.retry(env.path_key, env.claimed_path)
    return env


def succeeded_after_cancel() -> Environment:
    env = cancelled(setting_up())
    env.record_setup_outcome(env.setup_operation_id, True, None)
    return env


def paused() -> Environment:
    env = ready()
    env.record_paused({"snapshot": "s1"}, now())
    return env


def resume_requested() -> Environment:
    env = paused()
    env.request_resume()
    return env


def retiring(env: Environment) -> Environment:
    env.detach_thread("t1", env.modified_on, GRACE_MS)
    return env


def deleted(env: Environment) -> Environment:
    env.detach_thread("t1", env.modified_on, None)
    env.request_deletion()
    return env


def create_failed(failure: str = "terminal", attempts: int = 1, cleaned: bool = True) -> Environment:
    env = claimed()
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            env.retry(f"t1-{attempt}", f"/data/t1-{attempt}")
        env.record_create_failed(attempt, failure, "lock busy" if failure == "transient" else "no such branch")
        if cleaned:
            env.record_attempt_cleaned(attempt)
    return env


def removing(env: Environment) -> Environment:
    env.detach_thread("t1", env.modified_on, 0)
    assert env.start_removal(env.modified_on)
    return env


def tearing_down() -> Environment:
    env = removing(ready())
    env.start_teardown(env.teardown_operation())
    return env


def torn_down(outcome: str = "succeeded") -> Environment:
    env = tearing_down()
    env.record_teardown_outcome(env.teardown_operation_id, outcome, None if outcome == "succeeded" else "exit 1")
    return env


def remove_failed() -> Environment:
    env = removing(ready(owns_path=False))
    env.skip_teardown("no teardown to run")
    env.record_remove_failed(1, "device busy", env.modified_on + REMOVE_RETRY)
    return env


def removal_retried() -> Environment:
    env = remove_failed()
    assert env.retry_removal(env.remove_retry_at)
    return env


def removed() -> Environment:
    env = torn_down()
    env.record_removed(1)
    return env


def retried_create() -> Environment:
    env = create_failed()
    env.retry("t1-2", "/data/t1-2")
    return env


def never_retiring(env: Environment) -> Environment:
    env.detach_thread("t1", env.modified_on, None)
    return env


def cancelled_setup_failed() -> Environment:
    env = cancelled(setting_up())
    env.record_setup_outcome(env.setup_operation_id, False, "cancelled")
    return env


def skipped_teardown() -> Environment:
    env = removing(ready())
    env.skip_teardown("no teardown to run")
    return env


# -- the table --------------------------------------------------------------------------------

Build = Callable[[], Environment]
When = Callable[[Environment], datetime]
Expect = Callable[[Environment], Step]

AT_ONCE: When = lambda env: env.modified_on  # noqa: E731 - the moment of its last event

CASES: list[tuple[str, Build, When, Expect]] = [
    # creating
    ("creating", claimed, AT_ONCE, lambda e: RunCreate(1)),
    ("creating, next attempt", retried_create, AT_ONCE, lambda e: RunCreate(2)),
    ("creating, cancelled", cancelled_while_creating, AT_ONCE, lambda e: StopCreate(1)),
    # provisioning
    ("provisioning, owned path, setup not started", created, AT_ONCE, lambda e: StartSetup()),
    (
        "provisioning, path not owned",
        lambda: created(owns_path=False),
        AT_ONCE,
        lambda e: SkipSetup("the provider does not own the path"),
    ),
    ("provisioning, setup running", setting_up, AT_ONCE, lambda e: RunSetup(e.setup_operation_id)),
    (
        "provisioning, setup running, cancelled",
        lambda: cancelled(setting_up()),
        AT_ONCE,
        lambda e: CancelSetup(e.setup_operation_id),
    ),
    ("provisioning, cancelled before setup", lambda: cancelled(created()), AT_ONCE, lambda e: StartRemoval()),
    ("provisioning, setup succeeded after cancel", succeeded_after_cancel, AT_ONCE, lambda e: StartRemoval()),
    ("provisioning, failed setup retried", setup_retried, AT_ONCE, lambda e: StartSetup()),
    # ready
    ("ready, in use", ready, AT_ONCE, lambda e: PauseWhenIdle(e.modified_on)),
    ("ready, a pool's member waiting", pooled_member, AT_ONCE, lambda e: PauseWhenIdle(e.modified_on)),
    ("provisioning, a pool's member bound", bound_member, AT_ONCE, lambda e: BindMember()),
    ("ready, a bound member renamed", bound_member_renamed, AT_ONCE, lambda e: PauseWhenIdle(e.modified_on)),
    ("provisioning, a bound member's rename failed", bound_member_not_renamed, AT_ONCE, lambda e: StartRemoval()),
    ("ready, path not owned", lambda: ready(owns_path=False), AT_ONCE, lambda e: PauseWhenIdle(e.modified_on)),
    ("ready, paused", paused, AT_ONCE, lambda e: ResumeOnActivity(e.paused_at)),
    ("ready, paused, a message asked to resume", resume_requested, AT_ONCE, lambda e: Resume()),
    ("ready, retiring, deadline not passed", lambda: retiring(ready()), AT_ONCE, lambda e: WakeAt(e.retire_at)),
    ("ready, retiring, deadline passed", lambda: retiring(ready()), lambda e: e.retire_at, lambda e: StartRemoval()),
    ("ready, paused and retiring", lambda: retiring(paused()), AT_ONCE, lambda e: WakeAt(e.retire_at)),
    ("ready, never retires, idle", lambda: never_retiring(ready()), AT_ONCE, lambda e: PauseWhenIdle(e.modified_on)),
    ("ready, deleted", lambda: deleted(ready()), AT_ONCE, lambda e: StartRemoval()),
    # error
    ("error, create failed, not cleaned up", lambda: create_failed(cleaned=False), AT_ONCE, lambda e: CleanAttempt(1)),
    ("error, terminal create failure, cleaned up", create_failed, AT_ONCE, lambda e: Settled()),
    (
        "error, transient failure, retry not due",
        lambda: create_failed("transient"),
        AT_ONCE,
        lambda e: WakeAt(e.modified_on + RETRY_DELAY),
    ),
    (
        "error, transient failure, retry due",
        lambda: create_failed("transient"),
        lambda e: e.modified_on + RETRY_DELAY,
        lambda e: RetryTransient(1),
    ),
    (
        f"error, transient failure {TRANSIENT_RETRIES}, last retry due",
        lambda: create_failed("transient", TRANSIENT_RETRIES),
        lambda e: e.modified_on + RETRY_DELAY,
        lambda e: RetryTransient(TRANSIENT_RETRIES),
    ),
    (
        "error, transient failures exhausted",
        lambda: create_failed("transient", TRANSIENT_RETRIES + 1),
        lambda e: e.modified_on + RETRY_DELAY,
        lambda e: Settled(),
    ),
    (
        "error, transient failure, thread left",
        lambda: retiring(create_failed("transient")),
        lambda e: e.modified_on + RETRY_DELAY,
        lambda e: WakeAt(e.retire_at),
    ),
    ("error, setup failed", setup_failed, AT_ONCE, lambda e: Settled()),
    ("error, setup failed, retiring", lambda: retiring(setup_failed()), AT_ONCE, lambda e: WakeAt(e.retire_at)),
    (
        "error, setup failed, retire deadline passed",
        lambda: retiring(setup_failed()),
        lambda e: e.retire_at,
        lambda e: StartRemoval(),
    ),
    ("error, create failed, deleted", lambda: deleted(create_failed()), AT_ONCE, lambda e: StartRemoval()),
    ("error, setup cancelled", cancelled_setup_failed, AT_ONCE, lambda e: StartRemoval()),
    # removing
    ("removing, owned path, teardown not started", lambda: removing(ready()), AT_ONCE, lambda e: StartTeardown()),
    (
        "removing, path not owned",
        lambda: removing(ready(owns_path=False)),
        AT_ONCE,
        lambda e: SkipTeardown("no teardown to run"),
    ),
    (
        "removing, create never returned a path",
        lambda: removing(create_failed()),
        AT_ONCE,
        lambda e: SkipTeardown("no teardown to run"),
    ),
    ("removing, teardown running", tearing_down, AT_ONCE, lambda e: RunTeardown(e.teardown_operation_id)),
    ("removing, teardown succeeded", torn_down, AT_ONCE, lambda e: Remove(1)),
    ("removing, teardown failed", lambda: torn_down("failed"), AT_ONCE, lambda e: Remove(1)),
    ("removing, teardown skipped", skipped_teardown, AT_ONCE, lambda e: Remove(1)),
    ("removing, remove retry pending", remove_failed, AT_ONCE, lambda e: WakeAt(e.remove_retry_at)),
    ("removing, remove retry due", remove_failed, lambda e: e.remove_retry_at, lambda e: RetryRemoval(1)),
    ("removing, removal retried", removal_retried, AT_ONCE, lambda e: Remove(2)),
    # removed
    ("removed", removed, AT_ONCE, lambda e: Settled()),
]


@pytest.mark.parametrize(("build", "when", "expect"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_next_step(build: Build, when: When, expect: Expect) -> None:
    env = build()
    assert env.next_step(when(env), RETRY_DELAY) == expect(env)


def test_the_table_covers_every_status_and_every_step() -> None:
    built = [(build(), when, expect) for _, build, when, expect in CASES]
    statuses = {env.public_status for env, _, _ in built}
    steps = {type(expect(env)) for env, _, expect in built}
    assert statuses == set(EnvironmentStatus)
    assert steps == set(get_args(Step))


def test_a_step_is_a_value_and_asking_changes_nothing() -> None:
    env = setting_up()
    env.collect_events()
    version = env.version
    assert env.next_step(now()) == env.next_step(now()) == RunSetup(env.setup_operation_id)
    assert env.version == version and env.collect_events() == []
