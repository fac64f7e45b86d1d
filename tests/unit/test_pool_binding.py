"""The pools' use cases on an in-memory store (SPEC 10): which member a placement binds, a stale
one never, a rename that failed sends the thread back to be placed, and the failure brake."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest

from bb_environments.domain.pool import Freshness
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.providers.contract import BaseHead

DEFAULT = {"branch": {"kind": "default"}}
HEAD = BaseHead("c1", "h1")


@pytest.fixture
def app() -> Iterator[Environments]:
    application = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    yield application
    application.close()


def placed(key: str, head: BaseHead | None = HEAD, inputs: object = DEFAULT) -> Placement:
    return Placement("git-worktree", "h1", "/p", inputs, key, f"/w/{key}", base_head=head)


def pool_with_members(app: Environments, count: int, setup_succeeds: bool = True) -> tuple[UUID, list[UUID]]:
    pool = app.set_pool("h1", "/p", "git-worktree", DEFAULT, count)
    app.refill_due(pool.id, Freshness(HEAD.base_commit, HEAD.setup_hash))
    members = []
    for number in range(count):
        member = app.add_member(pool.id, placed(f"pool-{number}"))
        assert member is not None
        app.record_created(member.id, 1, f"/w/pool-{number}", True, "main", {"branch": f"bb/pool-{number}"})
        operation = app.environment(member.id).setup_operation_id
        app.record_setup_outcome(member.id, operation, setup_succeeds, None if setup_succeeds else "exit 3")
        members.append(member.id)
    return pool.id, members


def test_a_placement_on_the_members_base_binds_one_and_the_pool_lets_it_go(app: Environments) -> None:
    pool, members = pool_with_members(app, 2)
    given = app.spawn_thread("t1", "/p", None, "h1", None, placed("t1"))
    assert given.id == members[0] and given.thread_ids == ["t1"] and given.binding
    assert app.pool(pool).members == [members[1]]
    assert app.thread("t1").environment_id == members[0]
    assert app.add_member(pool, placed("pool-9")) is not None  # its replacement is due
    ready = app.record_bound(given.id, {"branch": "bb/t1"})
    assert ready.status == EnvironmentStatus.READY and not ready.binding


@pytest.mark.parametrize(
    "head", [BaseHead("c2", "h1"), BaseHead("c1", "h2"), None], ids=["new commit", "new script", "head unread"]
)
def test_a_member_prepared_on_another_base_is_never_bound(app: Environments, head: BaseHead | None) -> None:
    pool, members = pool_with_members(app, 1)
    given = app.spawn_thread("t1", "/p", None, "h1", None, placed("t1", head))
    assert given.id not in members and given.pool_id is None
    assert app.pool(pool).members == members


def test_other_inputs_never_get_a_member(app: Environments) -> None:
    _, members = pool_with_members(app, 1)
    other = {"branch": {"kind": "new", "name": "x", "base": "main"}}
    assert app.spawn_thread("t1", "/p", None, "h1", None, placed("t1", inputs=other)).id not in members


def test_a_rename_that_failed_sends_the_thread_back_to_be_placed_and_removes_the_member(app: Environments) -> None:
    pool, members = pool_with_members(app, 1)
    app.spawn_thread("t1", "/p", None, "h1", None, placed("t1"))
    failed = app.record_bind_failed(members[0], "branch bb/t1 exists")
    assert failed.cancelled and failed.thread_ids == [] and failed.bound
    thread = app.thread("t1")
    assert thread.environment_id is None and thread.awaits_environment
    again = app.answer_first_message("t1", placed("t1"))
    assert again.id != members[0] and again.pool_id is None


def test_the_pool_pauses_after_its_limit_of_failed_setups_in_a_row(app: Environments) -> None:
    app.pool_max_failures = 2
    pool, _ = pool_with_members(app, 2, setup_succeeds=False)
    paused = app.pool(pool)
    assert paused.paused and paused.failures == 2 and "2 member setups failed in a row" in (paused.paused_reason or "")
    assert app.refill_due(pool, Freshness(HEAD.base_commit, HEAD.setup_hash)) == (0, 0)
    resumed = app.resume_pool(pool)
    assert not resumed.paused and resumed.failures == 0
