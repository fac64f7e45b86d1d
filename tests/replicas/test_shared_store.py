"""Two core replicas on one event store: each sees what the other wrote, the nested-path rule holds
across them, and a command that lost a race to the other runs again.

Both replicas are Environments with the shared-store strategy on one event store, a SQLite file or a
database of a real PostgreSQL server; each has its own connection and aggregate cache. Interleavings
are made deterministic by letting the other replica save just before one replica's save.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import RecordConflictError

from bb_environments.domain.claims import inside
from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import PathAlreadyClaimed
from bb_environments.domain.host_claims import HostClaims, host_claims_id
from bb_environments.domain.leases import SLUG_PATTERN
from bb_environments.domain.path_claim import PathClaim
from bb_environments.domain.pool import Freshness
from bb_environments.domain.thread import Thread
from bb_environments.entrypoints.bootstrap import AGGREGATE_CACHE
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.handlers.store import CommandConflicted, Store
from bb_environments.handlers.writers import SharedStore, SingleWriter, Writers
from bb_environments.providers.contract import BaseHead

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def replica(event_store: str, writers: Writers | None = None) -> Environments:
    """A core replica's application service, as bootstrap builds it, on the store `event_store` names."""
    return Environments(
        env={**event_store_environment(event_store), **AGGREGATE_CACHE},
        grace_for=lambda _: 0,
        writers=writers or SharedStore(),
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def event_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a new event store: a SQLite file, or a new database of the session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'events.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def replicas(event_store: str) -> Iterator[tuple[Environments, Environments]]:
    a, b = replica(event_store), replica(event_store)
    yield a, b
    a.close()
    b.close()


def spawn(app: Environments, thread_id: str, host_id: str = "h1", path: str | None = None) -> UUID:
    """A new thread and its new environment, claiming `path` on the host (none claimed without one)."""
    provider = "git-worktree" if path else "personal-workspace"
    return app.spawn_thread(
        thread_id, None, None, host_id, None, Placement(provider, host_id, None, {}, thread_id, path)
    ).id


def remove(app: Environments, thread_id: str, environment_id: UUID) -> None:
    """Cancel the thread's environment before it was created, and take it through to removed."""
    app.cancel_thread_message(thread_id)
    app.start_removal(environment_id, NOW)
    app.skip_teardown(environment_id, "nothing was created")
    app.record_removed(environment_id, 1)


def before_next_save(app: Environments, meanwhile: Callable[[], object], times: int = 1) -> None:
    """Run `meanwhile` just before each of `app`'s next `times` saves: after the command decided,
    before the store heard of its decision."""
    record = app._record
    left = [times]

    def interleaved(processing_event: Any) -> Any:
        left[0] -= 1
        if left[0] == 0:
            del app._record  # the class's own again
        meanwhile()
        return record(processing_event)

    app._record = interleaved


def test_a_thread_registered_through_one_replica_is_found_and_answered_by_the_other(replicas):
    a, b = replicas
    assert b.find_thread("t1") is None  # b has read the log up to here
    a.register_thread("t1", None, None, "h1", None)

    found = b.find_thread("t1")
    assert found is not None and found.host_id == "h1"
    environment = b.answer_first_message("t1", Placement("personal-workspace", "h1", None, {}, "t1", None))
    assert a.thread("t1").environment_id == environment.id
    assert a.environment(environment.id).thread_ids == ["t1"]


def test_an_environment_cached_by_one_replica_and_changed_by_the_other_is_changed_on_what_the_other_saved(replicas):
    a, b = replicas
    environment_id = spawn(a, "t1")
    assert a.environment(environment_id).thread_ids == ["t1"]  # cached in a
    b.register_thread("t2", None, None, "h1", None)
    b.attach_thread("t2", environment_id)

    a.archive_thread("t1", NOW)

    assert a.environment(environment_id).thread_ids == ["t2"]
    assert b.environment(environment_id).thread_ids == ["t2"]
    assert b.thread("t1").status == "archived"


def test_the_other_replicas_indexes_see_what_one_wrote(replicas):
    a, b = replicas
    assert (b.unfinished_environment_ids(), b.threads_awaiting_environment()) == ([], [])
    environment_id = spawn(a, "t1", path="/w/t1")
    a.record_created(environment_id, 1, "/w/t1", True, "main", None)  # and its setup starts
    operation = a.environment(environment_id).setup_operation_id
    assert b.unfinished_environment_ids() == [environment_id]
    hook = b.recorded_hook(operation)
    assert hook is not None and hook.awaited and hook.environment_id == str(environment_id)
    # A request saved without its answer, as a crash of an earlier service between the two left it.
    waiting = Thread(thread_id="t2", project_path=None, parent_thread_id=None, host_id="h1", intent=None)
    waiting.request_environment()
    a.save(waiting)
    assert b.threads_awaiting_environment() == ["t2"]

    short_lived = spawn(a, "t3")
    assert b.unfinished_environment_ids() == [environment_id, short_lived]

    a.record_setup_outcome(environment_id, operation, True, None)
    a.provide_environment("t2", environment_id)
    remove(a, "t3", short_lived)

    assert b.threads_awaiting_environment() == []
    finished = b.recorded_hook(operation)
    assert finished is not None and not finished.awaited
    assert b.unfinished_environment_ids() == [environment_id]


def live_claims_through_the_log(app: Environments) -> Iterator[dict[tuple[str, str], UUID]]:
    """The live claims after each claim event of the log, by host and path."""
    live: dict[tuple[str, str], UUID] = {}
    paths: dict[UUID, tuple[str, str]] = {}
    for notification in app.recorder.select_notifications(start=1, limit=10**6):
        event = app.mapper.to_domain_event(notification)
        if isinstance(event, PathClaim.Taken):
            paths[event.originator_id] = (event.host_id, event.path)
        if isinstance(event, (PathClaim.Taken, PathClaim.Retaken)):
            live[paths[event.originator_id]] = event.environment_id
        elif isinstance(event, PathClaim.Released):
            del live[paths[event.originator_id]]
        else:
            continue
        yield dict(live)


def test_nested_claims_decided_through_either_replica_are_refused_even_on_a_stale_decision(replicas):
    a, b = replicas
    held = spawn(a, "t1", "h1", "/w/a")
    with pytest.raises(PathAlreadyClaimed, match="/w/a/b overlaps /w/a"):
        spawn(b, "t2", "h1", "/w/a/b")
    spawn(b, "t2", "h2", "/w/a")  # another host's paths are another matter
    with pytest.raises(PathAlreadyClaimed, match="/w/a/b overlaps /w/a"):
        spawn(a, "t3", "h2", "/w/a/b")
    with pytest.raises(PathAlreadyClaimed, match="/w overlaps /w/a"):
        spawn(a, "t3", "h2", "/w")

    # a decides on what it read; b claims around that path before a's decision reaches the store.
    before_next_save(a, lambda: spawn(b, "t4", "h1", "/w/c"))
    with pytest.raises(RecordConflictError):
        spawn(a, "t5", "h1", "/w/c/d")
    # Run again, the same command decides on what b saved.
    with pytest.raises(PathAlreadyClaimed, match="/w/c/d overlaps /w/c"):
        spawn(a, "t5", "h1", "/w/c/d")
    assert a.find_thread("t5") is None and b.find_thread("t5") is None

    remove(b, "t1", held)  # a's claim, released by b
    spawn(a, "t5", "h1", "/w/a/b")

    moments = list(live_claims_through_the_log(b))
    for live in moments:
        for (host, path), holder in live.items():
            assert not [
                other
                for (other_host, other), other_holder in live.items()
                if other_host == host and other_holder != holder and inside(other, path)
            ], live
    assert any(("h1", "/w/a") in live and ("h2", "/w/a") in live for live in moments)
    host_claims = a.repository.get(host_claims_id("h1"))
    assert isinstance(host_claims, HostClaims)
    assert set(host_claims.paths.holders()) == {"/w/c", "/w/a/b"}


async def test_a_command_that_lost_a_race_through_the_store_runs_again_and_succeeds(replicas):
    a, b = replicas
    store = Store(a)
    try:
        # Both claim on h1, apart: a's first save conflicts on the host's claims b just changed.
        before_next_save(a, lambda: spawn(b, "t2", "h1", "/w/b"))
        environment = await store.run(
            a.spawn_thread, "t1", None, None, "h1", None, Placement("git-worktree", "h1", None, {}, "t1", "/w/a")
        )
    finally:
        store.close()
    assert b.thread("t1").environment_id == environment.id
    assert b.environment(environment.id).claimed_path == "/w/a"
    assert set(b.repository.get(host_claims_id("h1")).paths.holders()) == {"/w/a", "/w/b"}


async def test_a_command_that_keeps_losing_races_ends_in_a_clear_error_and_saves_nothing(replicas):
    a, b = replicas
    store = Store(a)
    others = itertools.count()

    def another_claim_on_the_host() -> None:
        other = f"other-{next(others)}"
        spawn(b, other, "h1", f"/w/{other}")

    try:
        before_next_save(a, another_claim_on_the_host, times=SharedStore.command_tries)
        with pytest.raises(
            CommandConflicted,
            match=f"spawn_thread lost the race to another writer of the event store {SharedStore.command_tries} times, "
            "nothing of it was saved",
        ):
            await store.run(
                a.spawn_thread, "t1", None, None, "h1", None, Placement("git-worktree", "h1", None, {}, "t1", "/w/a")
            )
    finally:
        store.close()
    assert b.find_thread("t1") is None
    assert len(b.repository.get(host_claims_id("h1")).paths.holders()) == SharedStore.command_tries


def test_a_host_whose_claims_one_writer_decided_starts_its_host_claims_from_the_live_ones(event_store):
    before = replica(event_store, SingleWriter())
    held = spawn(before, "t1", "h1", "/w/a")
    remove(before, "t2", spawn(before, "t2", "h1", "/w/b"))
    before.close()
    shared = replica(event_store)
    try:
        with pytest.raises(PathAlreadyClaimed, match="/w/a/c overlaps /w/a"):
            spawn(shared, "t3", "h1", "/w/a/c")
        third = spawn(shared, "t3", "h1", "/w/b/c")

        started, *then = shared.events.get(host_claims_id("h1"))
        assert isinstance(started, HostClaims.Started) and started.held == {"/w/a": held}
        held_since = [(type(e).__name__, e.path, e.environment_id) for e in then if isinstance(e, HostClaims.Held)]
        assert held_since == [("Held", "/w/b/c", third)]  # beside the leases of its ports and slug
    finally:
        shared.close()


class CountedReads:
    """Counts the queries of the log a recorder answers."""

    def __init__(self, app: Environments) -> None:
        self.count = 0
        recorder = app.recorder
        select = recorder.select_notifications

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return select(*args, **kwargs)

        recorder.select_notifications = counted


def test_a_single_writer_reads_the_log_only_for_what_others_could_not_have_written(event_store):
    app = replica(event_store, SingleWriter())
    reads = CountedReads(app)
    try:
        assert app.find_thread("t1") is None and reads.count == 1
        app.register_thread("t1", None, None, "h1", None)  # its own save: folded from what it wrote
        assert app.find_thread("t1") is not None and app.find_thread("t2") is None
        assert reads.count == 1
        # Another writer is what a single writer rules out: what it writes is not read.
        other = replica(event_store, SingleWriter())
        other.register_thread("t2", None, None, "h1", None)
        other.close()
        assert app.find_thread("t2") is None and reads.count == 1
    finally:
        app.close()


def test_a_shared_store_replica_reads_what_the_log_gained_since_it_last_looked_whoever_wrote_it(replicas):
    a, b = replicas
    reads = CountedReads(b)
    assert b.find_thread("t1") is None and reads.count == 0  # nothing in the log to read
    a.register_thread("t1", None, None, "h1", None)
    assert b.find_thread("t1") is not None and reads.count == 1
    assert b.find_thread("t2") is None and reads.count == 1  # nobody saved since
    a.register_thread("t2", None, None, "h1", None)
    b.register_thread("t3", None, None, "h1", None)  # reads t2 first; its own save is folded from what it wrote
    assert b.find_thread("t2") is not None and b.find_thread("t3") is not None and reads.count == 2


def test_a_replicas_own_save_after_another_writers_save_is_read_with_it(replicas):
    a, b = replicas
    assert b.find_thread("t0") is None
    # a saves after b looked at the log and before b's save: b's save does not follow on from what it read.
    before_next_save(b, lambda: a.register_thread("t1", None, None, "h1", None))
    b.register_thread("t2", None, None, "h1", None)
    assert b.find_thread("t1") is not None and b.find_thread("t2") is not None
    assert b.find_thread("t1") is not None  # and a save of a's after those, read too
    a.register_thread("t3", None, None, "h1", None)
    assert b.find_thread("t3") is not None


class CountedHeads:
    """Counts the queries of the log's head a recorder answers."""

    def __init__(self, app: Environments) -> None:
        self.count = 0
        recorder = app.recorder
        head = recorder.max_notification_id

        def counted() -> Any:
            self.count += 1
            return head()

        recorder.max_notification_id = counted


async def test_the_lookups_of_one_run_of_a_command_look_at_the_log_once(replicas):
    a, b = replicas
    heads, reads = CountedHeads(a), CountedReads(a)
    store = Store(a)
    try:
        spawn(b, "t0", "h1", "/w/b")
        # The thread, the path's holder, the host's live environments and the claim: four lookups
        # in three indexes, all behind what b wrote, read at once; the head is looked at again once
        # the host's claims are loaded (nothing new: no second read), as the live limits count on it.
        await store.run(
            a.spawn_thread, "t1", None, None, "h1", None, Placement("git-worktree", "h1", None, {}, "t1", "/w/a")
        )
        assert (heads.count, reads.count) == (2, 1)
        # A run that lost its race looks again, and decides on what the other writer saved.
        before_next_save(a, lambda: spawn(b, "t2", "h1", "/w/c/inner"))
        with pytest.raises(PathAlreadyClaimed, match="/w/c overlaps /w/c/inner"):
            await store.run(
                a.spawn_thread, "t3", None, None, "h1", None, Placement("git-worktree", "h1", None, {}, "t3", "/w/c")
            )
        assert (heads.count, reads.count) == (6, 2)  # the first run found a's own save folded already
        # Outside a command's run (a direct caller of the application), each lookup looks for itself.
        assert a.find_thread("t2") is not None and a.find_thread("t0") is not None
        assert (heads.count, reads.count) == (8, 2)
    finally:
        store.close()


async def test_commands_during_and_after_a_restart_of_the_postgresql_server_are_saved(postgres_server, postgres_url):
    store = Store(replica(postgres_url))
    try:
        await store.run(store.app.register_thread, "before", None, None, "h1", None)
        restarting = asyncio.create_task(asyncio.to_thread(postgres_server.restart))
        during = []
        while not restarting.done():  # a save on a connection the restart dropped is tried again by the library
            during.append(f"during-{len(during)}")
            await store.run(store.app.register_thread, during[-1], None, None, "h1", None)
        await restarting
        await store.run(store.app.register_thread, "after", None, None, "h1", None)
    finally:
        store.close()
    other = replica(postgres_url)
    try:
        assert all(other.find_thread(thread) is not None for thread in ["before", *during, "after"])
    finally:
        other.close()


async def spawned_through(stores: tuple[Store, Store], number: int, listening: tuple[int, ...] = ()) -> UUID:
    """Thread t{number} spawned on h1 through the writer of replica `number % 2`."""
    store = stores[number % 2]
    placement = Placement("personal-workspace", "h1", None, {}, f"t{number}", None, listening=listening)
    return (await store.run(store.app.spawn_thread, f"t{number}", None, None, "h1", None, placement)).id


async def test_two_hundred_spawns_on_one_host_through_two_replicas_at_once_are_all_saved(postgres_url):
    """Every spawn on a host saves its HostClaims, so two replicas spawning there at once keep
    conflicting: each loser runs again on what the other saved, until it wins. With 5 runs and
    pauses of at most 5–20 ms between them, 3 to 5 of these 200 spawns failed with
    CommandConflicted on this machine's PostgreSQL, every time; the unluckiest needs 7 or 8 runs
    while the other replica's batch goes on."""
    stores = Store(replica(postgres_url)), Store(replica(postgres_url))
    try:
        ids = await asyncio.gather(*(spawned_through(stores, number) for number in range(200)))
    finally:
        for store in stores:
            store.close()  # and its replica
    again = replica(postgres_url)
    try:
        assert {again.thread(f"t{number}").environment_id for number in range(200)} == set(ids)
        assert len(set(ids)) == 200
    finally:
        again.close()


async def test_twenty_spawns_through_two_replicas_lease_disjoint_blocks_clear_of_a_listening_port_kept_by_a_restart(
    event_store,
):
    a, b = replica(event_store), replica(event_store)
    stores = Store(a), Store(b)
    listening = (20013,)  # as the host's plan found it
    try:
        ids = await asyncio.gather(*(spawned_through(stores, number, listening) for number in range(20)))
    finally:
        for store in stores:
            store.close()
        a.close()
        b.close()
    again = replica(event_store)  # a restart: a new replica reads every lease from the log
    try:
        environments = [again.environment(environment_id) for environment_id in ids]
        blocks = sorted(
            (range(e.ports.first, e.ports.last + 1) for e in environments if e.ports), key=lambda r: r.start
        )
        assert len(blocks) == 20
        assert all(20013 not in block for block in blocks)
        assert all(earlier.stop <= later.start for earlier, later in zip(blocks, blocks[1:]))
        slugs = {e.slug for e in environments}
        assert len(slugs) == 20 and all(slug and SLUG_PATTERN.match(slug) for slug in slugs)
        assert again.repository.get(host_claims_id("h1")).leases == again.claims.leases_on("h1")
        # One more, decided by the restarted replica against every kept lease.
        more = again.spawn_thread(
            "t20",
            None,
            None,
            "h1",
            None,
            Placement("personal-workspace", "h1", None, {}, "t20", None, listening=listening),
        )
        assert more.ports is not None and all(more.ports.first not in block for block in blocks)
    finally:
        again.close()


async def test_a_lease_decided_on_a_stale_read_is_decided_again_on_what_the_other_replica_leased(replicas):
    a, b = replicas
    store = Store(a)
    try:
        # a decides from the host's claims before b's lease is saved: its save conflicts, and it decides again.
        before_next_save(a, lambda: spawn(b, "t1"))
        environment = await store.run(
            a.spawn_thread, "t2", None, None, "h1", None, Placement("personal-workspace", "h1", None, {}, "t2", None)
        )
    finally:
        store.close()
    other = b.environment(b.thread("t1").environment_id)
    assert environment.ports is not None and other.ports is not None
    assert environment.ports.first == other.ports.last + 1 and environment.slug != other.slug


def ready_member(app: Environments, head: BaseHead) -> UUID:
    """A pool of git-worktree environments of /p on h1, with one member set up on `head`."""
    pool = app.set_pool("h1", "/p", "git-worktree", {"branch": {"kind": "default"}}, 1)
    app.refill_due(pool.id, Freshness(head.base_commit, head.setup_hash))
    member = app.add_member(
        pool.id,
        Placement("git-worktree", "h1", "/p", {"branch": {"kind": "default"}}, "pool-1", "/w/pool-1", base_head=head),
    )
    assert member is not None
    app.record_created(member.id, 1, "/w/pool-1", True, "main", {"branch": "bb/pool-1"})
    setup = app.environment(member.id).setup_operation_id
    app.record_setup_outcome(member.id, setup, True, None)
    assert app.environment(member.id).pooled
    return member.id


async def test_a_pools_member_taken_by_two_replicas_at_once_is_bound_to_one_thread(replicas):
    a, b = replicas
    head = BaseHead("c1", None)
    member = ready_member(a, head)

    def placed(thread_id: str) -> Placement:
        return Placement(
            "git-worktree", "h1", "/p", {"branch": {"kind": "default"}}, thread_id, f"/w/{thread_id}", base_head=head
        )

    store = Store(a)
    try:
        # b binds the member between a's decision and a's save: a's save conflicts, and a decides again.
        before_next_save(a, lambda: b.spawn_thread("t2", "/p", None, "h1", None, placed("t2")))
        given = await store.run(a.spawn_thread, "t1", "/p", None, "h1", None, placed("t1"))
    finally:
        store.close()
    assert b.thread("t2").environment_id == member
    assert given.id != member and given.pool_id is None
    bound = [e for e in b.events.get(member) if isinstance(e, Environment.Bound)]
    assert [e.thread_id for e in bound] == ["t2"]
    assert b.pool(UUID(b.environment(member).pool_id or "")).members == []
