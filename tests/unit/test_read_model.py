"""The read model applies the log exactly once per position, one transaction per batch, and a
rebuild swaps in a complete model while batches keep being applied (real SQLite files, a real
event store)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import msgspec
import pytest

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.handlers.store import Store
from bb_environments.projections.read_model import Applied, ReadModel
from bb_environments.projections.rebuild_scratch import RebuildAbandoned
from bb_environments.projections.views import EnvironmentView, ThreadView, TranscriptEntry, ViewPage, public_view
from tests.unit.test_event_documents import record_every_event

T = TypeVar("T")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    app = Environments(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(tmp_path / "events.sqlite")},
        grace_for=lambda _: 0,
    )
    running = Store(app)
    yield running
    running.close()


@pytest.fixture
async def read_model(tmp_path: Path) -> AsyncIterator[ReadModel]:
    model = await ReadModel.open(tmp_path / "read-models.sqlite")
    yield model
    await model.close()


def live_environments(app: Environments, first: int, count: int) -> None:
    """Spawn environments t<first>... and take them to ready; every other one is archived and removed."""
    for n in range(first, first + count):
        thread_id, path = f"t{n}", f"/data/t{n}"
        environment = app.spawn_thread(
            thread_id, "/repo", None, "local", None, Placement("git-worktree", "local", "/repo", {}, thread_id, path)
        )
        app.record_created(environment.id, 1, path, True, "main", None)
        app.start_setup(environment.id)
        app.record_setup_outcome(environment.id, app.environment(environment.id).setup_operation_id, True, None)
        if n % 2:
            app.archive_thread(thread_id, NOW)
            app.start_removal(environment.id, NOW)
            app.start_teardown(environment.id)
            app.record_teardown_outcome(
                environment.id, app.environment(environment.id).teardown_operation_id, "succeeded", None
            )
            app.record_removed(environment.id, 1)


def every_state(app: Environments) -> None:
    """Environments in every public status and in the ways to reach them, threads in every state:
    each one step past the one before, as the service records them."""

    def spawned(n: int, provider: str = "git-worktree") -> UUID:
        thread_id, path = f"s{n}", f"/data/s{n}"
        return app.spawn_thread(
            thread_id,
            "/repo",
            None,
            "local",
            None,
            Placement(provider, "local", "/repo", {"branch": {"name": f"b{n}"}}, thread_id, path),
        ).id

    def set_up(environment_id: UUID, succeeded: bool = True) -> None:
        app.record_created(environment_id, 1, app.environment(environment_id).claimed_path, True, "main", None)
        app.start_setup(environment_id)
        app.record_setup_outcome(
            environment_id,
            app.environment(environment_id).setup_operation_id,
            succeeded,
            None if succeeded else "exit status 1",
        )

    spawned(0)  # creating
    app.record_created(provisioning := spawned(1), 1, "/data/s1", True, "main", None)
    app.start_setup(provisioning)  # provisioning, its setup running
    set_up(spawned(2))  # ready
    app.record_create_failed(spawned(3), 1, "permanent", "the branch exists")  # error, before a path
    set_up(spawned(4), succeeded=False)  # error, its setup failed
    set_up(joined := spawned(5))
    app.spawn_thread("s5-b", "/repo", "s5", "local", None, joined)  # ready, two threads
    set_up(spawned(6))
    app.archive_thread("s6", NOW)  # retiring
    set_up(removing := spawned(7))
    app.archive_thread("s7", NOW)
    app.start_removal(removing, NOW)
    app.start_teardown(removing)  # removing, its teardown running
    live_environments(app, 8, 2)  # ready; removed
    app.archive_thread("s0", NOW)  # cancelled while creating
    set_up(paused := spawned(10, "modal-sandbox"))
    app.record_paused(paused, {"sandbox": "sb-1"}, NOW)  # ready, paused
    app.record_create_failed(retried := spawned(11), 1, "transient", "git is busy")
    app.record_attempt_cleaned(retried, 1)
    app.retry(retried, "s11-2", "/data/s11-2")  # creating again, a second attempt
    app.register_thread("s12", "/repo", None, "local", None)
    app.refuse_thread("s12", "no provider")  # refused
    app.archive_thread("s5-b", NOW)
    app.unarchive_thread("s5-b")  # unarchived, without an environment
    record_every_event(app)


def batches(app: Environments, after: int = 0, size: int = 7) -> list[list[Applied]]:
    """The log after `after` as the projection consumer gets it: batches of (position, view)."""
    logged = LogReader(app).page(after, limit=10**6)
    items = [Applied(entry.notification_id, entry.notification_id, entry.view) for entry in logged]
    return [items[i : i + size] for i in range(0, len(items), size)]


def no_gap(*_: int) -> list:
    raise AssertionError("no gap to fill")


async def rows(model: ReadModel) -> dict[str, list[tuple]]:
    """Every row of the tables a rebuild writes, and the transcript, in rowid order (the order of
    their last writes)."""
    tables = {}
    for table in ("environments", "threads", "transcript"):
        async with model._db.execute(f"SELECT * FROM {table} ORDER BY rowid") as found:
            tables[table] = list(await found.fetchall())
    return tables


async def state(model: ReadModel) -> tuple[list, list]:
    """Everything list answers, in its order."""
    return (msgspec.to_builtins(await model.environments()), msgspec.to_builtins(await model.threads()))


async def test_each_position_is_applied_once_even_when_a_batch_comes_again_or_overlaps(store, read_model, tmp_path):
    live_environments(store.app, 0, 3)
    every = [item for batch in batches(store.app) for item in batch]
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    applied = await state(read_model)
    head = store.app.head()

    # Redelivered: the last batch again, then one reaching back over applied positions with other views.
    await read_model.apply(batches(store.app)[-1], no_gap)
    forged = [
        item._replace(view=msgspec.structs.replace(item.view, status="forged"))
        for item in every[-5:]
        if isinstance(item.view, EnvironmentView)
    ]
    await read_model.apply(forged, no_gap)

    assert await state(read_model) == applied
    assert read_model.position == head
    assert sorted(e["status"] for e in applied[0]) == ["ready", "ready", "removed"]
    await read_model.close()
    reopened = await ReadModel.open(tmp_path / "read-models.sqlite")
    try:
        assert reopened.position == head and await state(reopened) == applied
    finally:
        await reopened.close()


async def test_a_batch_mixing_applied_and_new_positions_applies_only_the_new_ones(store, read_model):
    live_environments(store.app, 0, 1)
    first = [item for batch in batches(store.app) for item in batch]
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    live_environments(store.app, 1, 1)
    new = [item for batch in batches(store.app, after=first[-1].notification_id) for item in batch]
    stale = [
        item._replace(view=msgspec.structs.replace(item.view, status="forged"))
        for item in first
        if isinstance(item.view, EnvironmentView)
    ]

    await read_model.apply([*stale, *new], no_gap)

    assert sorted(e["status"] for e in (await state(read_model))[0]) == ["ready", "removed"]
    assert read_model.position == store.app.head()


async def test_a_batch_the_disk_cannot_take_leaves_nothing_and_applies_whole_when_delivered_again(store, read_model):
    live_environments(store.app, 0, 1)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    before, position = await state(read_model), read_model.position
    live_environments(store.app, 1, 30)
    batch = [item for batch in batches(store.app, after=position) for item in batch]
    # The disk is full: SQLite may not grow the file by one page.
    connection = read_model._db
    async with connection.execute("PRAGMA page_count") as rows:
        pages = (await rows.fetchone())[0]
    await connection.execute(f"PRAGMA max_page_count = {pages}")

    with pytest.raises(sqlite3.OperationalError, match="full"):
        await read_model.apply(batch, no_gap)
    assert await state(read_model) == before and read_model.position == position

    await connection.execute(f"PRAGMA max_page_count = {2**30}")
    await read_model.apply(batch, no_gap)
    assert len((await state(read_model))[0]) == 31 and read_model.position == store.app.head()


async def test_a_gap_below_a_batch_is_filled_from_the_log_first(store, read_model):
    live_environments(store.app, 0, 2)
    reader = LogReader(store.app)
    every = [item for batch in batches(store.app) for item in batch]
    filled: list[tuple[int, int]] = []

    async def fill(after: int, upto: int) -> list:
        filled.append((after, upto))
        return reader.between(after, upto)

    await read_model.apply(every[:3], fill)
    await read_model.apply(every[10:], fill)

    assert filled == [(3, 10)]
    assert sorted(e["status"] for e in (await state(read_model))[0]) == ["ready", "removed"]


async def test_a_rebuild_gives_the_live_model_in_the_same_order(store, read_model, tmp_path):
    live_environments(store.app, 0, 6)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    live = await state(read_model)
    fresh = await ReadModel.open(tmp_path / "fresh.sqlite")
    try:
        counts = await fresh.rebuild(LogReader(store.app).latest_views, _stream_position)
        assert await state(fresh) == live and fresh.position == store.app.head()
        assert (counts.events, counts.environments, counts.threads) == (store.app.head(), 6, 6)
    finally:
        await fresh.close()

    await read_model.rebuild(LogReader(store.app).latest_views, _stream_position)
    assert await state(read_model) == live


async def test_a_rebuild_of_a_log_with_every_state_equals_the_live_model_row_by_row(store, read_model, tmp_path):
    every_state(store.app)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    await read_model.add_transcript([TranscriptEntry(1, "e-1", True, "setup"), TranscriptEntry(2, "e-1", False, "ok")])
    live = await rows(read_model)
    fresh = await ReadModel.open(tmp_path / "fresh.sqlite")
    try:
        await fresh.rebuild(LogReader(store.app).latest_views, _stream_position)
        rebuilt = await rows(fresh)
    finally:
        await fresh.close()
    await read_model.rebuild(LogReader(store.app).latest_views, _stream_position)

    assert rebuilt["environments"] == live["environments"] and rebuilt["threads"] == live["threads"]
    assert await rows(read_model) == live  # the transcript is the live one's, not the log's
    environments = [msgspec.json.decode(row[3], type=EnvironmentView) for row in live["environments"]]
    assert {e.status for e in environments} == {
        "creating",
        "provisioning",
        "ready",
        "error",
        "retiring",
        "removing",
        "removed",
    }
    assert any(e.paused_at for e in environments) and any(len(e.thread_ids) == 2 for e in environments)
    threads = [msgspec.json.decode(row[2], type=ThreadView) for row in live["threads"]]
    assert {t.status for t in threads} == {"active", "archived"} and any(t.refusal for t in threads)
    # Each row is its aggregate as the library itself loads it from the log.
    for view in [*environments, *threads]:
        aggregate = (
            store.app.environment(UUID(view.id)) if isinstance(view, EnvironmentView) else store.app.thread(view.id)
        )
        assert public_view(aggregate) == view


async def test_a_rebuild_shows_the_old_model_until_it_swaps_in_and_catches_up_with_live_batches(store, read_model):
    live_environments(store.app, 0, 4)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    reader = LogReader(store.app)
    seen: list[tuple[int, tuple[list, list]]] = []
    expected: dict[int, tuple[list, list]] = {read_model.position: await state(read_model)}

    async def go_on() -> None:
        """Meanwhile the service goes on: a new environment is saved and its events applied."""
        applied = read_model.position
        await store.run(live_environments, store.app, 100 + len(seen), 1)
        for batch in batches(store.app, after=applied):
            await read_model.apply(batch, no_gap)
        expected[read_model.position] = await state(read_model)

    async def what_list_shows() -> tuple[int, tuple[list, list]]:
        return read_model.position, await state(read_model)

    loop = asyncio.get_running_loop()

    def on_loop(coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=30)

    def read_page(after: int, upto: int | None) -> ViewPage:  # on the rebuild's thread
        seen.append(on_loop(what_list_shows()))
        if upto is None and len(seen) == 2:
            on_loop(go_on())  # read by the rebuild's next pages
        page = reader.latest_views(after, upto, limit=5)
        if upto is None and not page.events:
            on_loop(go_on())  # after the rebuild's last page: it catches up with what was applied
        return page

    counts = await read_model.rebuild(read_page, _stream_position)

    assert len(seen) > 4
    assert all(listed == expected[position] for position, listed in seen)  # never a partial model
    assert read_model.position == store.app.head() == counts.events
    assert await state(read_model) == expected[read_model.position]
    assert counts.environments == 6


async def test_rebuilds_while_lists_are_read_all_succeed_and_the_lists_never_lose_a_row(store, read_model):
    live_environments(store.app, 0, 20)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    live = await state(read_model)
    rebuilt = asyncio.Event()

    async def keep_listing() -> int:
        """What `environment list` does, page after page, over and over: each pass sees all 20."""
        passes = 0
        while not rebuilt.is_set():
            listed, after = [], None
            while page := await read_model.environments(after=after, limit=3):
                listed += page
                after = page[-1].id
            assert len(listed) == 20
            passes += 1
        return passes

    readers = [asyncio.create_task(keep_listing()) for _ in range(8)]
    try:
        for _ in range(5):
            await read_model.rebuild(LogReader(store.app).latest_views, _stream_position)
    finally:
        rebuilt.set()
        passes = await asyncio.gather(*readers)
    assert all(passes)
    assert await state(read_model) == live


async def test_a_rebuild_cut_off_leaves_the_old_model_and_no_scratch_file(store, read_model, tmp_path):
    live_environments(store.app, 0, 3)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    before, position = await state(read_model), read_model.position
    reader = LogReader(store.app)
    pages = 0

    def read_page(after: int, upto: int | None) -> ViewPage:
        nonlocal pages
        pages += 1
        if pages == 3:
            raise OSError("the log's disk went away")
        return reader.latest_views(after, upto, limit=5)

    with pytest.raises(OSError):
        await read_model.rebuild(read_page, _stream_position)

    assert await state(read_model) == before and read_model.position == position
    assert not (tmp_path / "read-models.sqlite.rebuilding").exists()


async def test_a_rebuild_cancelled_mid_page_reads_no_further_and_leaves_the_old_model_and_no_scratch_file(
    store, read_model, tmp_path
):
    live_environments(store.app, 0, 3)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    before, position = await state(read_model), read_model.position
    reader = LogReader(store.app)
    reading, go_on = threading.Event(), threading.Event()
    pages = 0

    def read_page(after: int, upto: int | None) -> ViewPage:  # on the rebuild's thread
        nonlocal pages
        pages += 1
        reading.set()
        go_on.wait(timeout=30)
        return reader.latest_views(after, upto, limit=5)

    rebuild = asyncio.create_task(read_model.rebuild(read_page, _stream_position))
    assert await asyncio.to_thread(reading.wait, 30)
    rebuild.cancel()
    await asyncio.sleep(0)  # one turn of the loop: the cancellation reaches the rebuild mid-page
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await rebuild

    assert pages == 1  # it read no further
    assert await state(read_model) == before and read_model.position == position
    assert not (tmp_path / "read-models.sqlite.rebuilding").exists()


async def test_closing_mid_rebuild_waits_until_it_reads_the_log_no_more(store, tmp_path):
    """The service's exit closes the read models, then the event store: a rebuild still reading
    the log (a replay asked just before) stops at its page, and nothing reads the store after."""
    model = await ReadModel.open(tmp_path / "read-models.sqlite")
    live_environments(store.app, 0, 3)
    reader = LogReader(store.app)
    reading, go_on = threading.Event(), threading.Event()
    pages, closed = 0, False

    def read_page(after: int, upto: int | None) -> ViewPage:  # on the rebuild's thread
        nonlocal pages
        pages += 1
        assert not closed, "read after the read models closed"
        reading.set()
        go_on.wait(timeout=30)
        return reader.latest_views(after, upto, limit=5)

    rebuild = asyncio.create_task(model.rebuild(read_page, _stream_position))
    assert await asyncio.to_thread(reading.wait, 30)
    closing = asyncio.create_task(model.close())
    await asyncio.sleep(0)
    go_on.set()
    await closing
    closed = True

    with pytest.raises(RebuildAbandoned):
        await rebuild
    assert pages == 1
    assert not (tmp_path / "read-models.sqlite.rebuilding").exists()


async def test_a_scratch_file_left_by_a_crash_is_deleted_at_open(tmp_path):
    scratch = tmp_path / "read-models.sqlite.rebuilding"
    scratch.write_bytes(b"half a rebuild")
    model = await ReadModel.open(tmp_path / "read-models.sqlite")
    await model.close()
    assert not scratch.exists()


async def _stream_position() -> int:
    return 0


async def test_environments_removed_before_the_limit_are_forgotten_with_their_transcripts_and_threads(
    store, read_model
):
    live_environments(store.app, 0, 4)  # t1 and t3 removed, t0 and t2 ready
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    ids = {thread: str(store.app.find_thread(thread).environment_id) for thread in ("t0", "t1", "t2", "t3")}
    await read_model.add_transcript(
        [TranscriptEntry(n, ids[thread], False, "line") for n, thread in enumerate(("t0", "t1"))]
    )
    a_day = timedelta(days=1)

    assert await read_model.removed_before(datetime.now(UTC) - a_day, 10) == []
    removed = await read_model.removed_before(datetime.now(UTC) + a_day, 10)
    assert sorted(view.id for view in removed) == sorted([ids["t1"], ids["t3"]])
    assert [view.id for view in await read_model.removed_before(datetime.now(UTC) + a_day, 1)] == [removed[0].id]
    await read_model.forget_environments([ids["t0"], ids["t1"]])  # t0 is not removed: it stays

    assert {view.id for view in await read_model.environments()} == {ids["t0"], ids["t2"], ids["t3"]}
    assert {thread.id for thread in await read_model.threads()} == {"t0", "t2", "t3"}
    assert await read_model.transcript(ids["t1"]) == [] and await read_model.transcript(ids["t0"]) == ["line"]


def test_the_log_reader_finds_the_ids_a_batch_claims_looking_at_the_head_only_past_the_head_it_saw(tmp_path):
    app = Environments(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(tmp_path / "events.sqlite")},
        grace_for=lambda _: 0,
    )
    heads = []
    head = app.recorder.max_notification_id

    def counted() -> int | None:
        heads.append(1)
        return head()

    app.recorder.max_notification_id = counted  # type: ignore[method-assign]
    try:
        app.register_thread("t1", None, None, "local", None)
        assert set(LogReader(app).at([1, 2])) == {1} and len(heads) == 1  # 2 is past the head: never read
        reader = LogReader(app)
        assert set(reader.at([1])) == {1} and len(heads) == 2
        app.register_thread("t2", None, None, "local", None)
        assert set(reader.at([2, 3])) == {2} and len(heads) == 3  # past the head it saw: looked at again
        reader._documents.clear()  # as its cache forgets old documents
        assert set(reader.at([1, 2])) == {1, 2} and len(heads) == 3  # within the head it saw: read at once
    finally:
        app.close()
