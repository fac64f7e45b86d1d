"""The read model applies the log exactly once per position, one transaction per batch, and a
rebuild swaps in a complete model while batches keep being applied (real SQLite files, a real
event store)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest

from bb_environments.bus.log_reader import LogReader
from bb_environments.domain.application import Environments, Placement
from bb_environments.domain.thread import Thread
from bb_environments.handlers.api import replay_log
from bb_environments.handlers.store import Store
from bb_environments.projections.read_model import Applied, ReadModel
from bb_environments.projections.views import EnvironmentView, ViewPage

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                            "SQLITE_DBNAME": str(tmp_path / "events.sqlite")}, grace_for=lambda _: 0)
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
        environment = app.spawn_thread(Thread(thread_id, "/repo", None, "local", None),
                                       Placement("git-worktree", "local", "/repo", {}, thread_id, path))
        app.record_created(environment.id, 1, path, True, "main", None)
        app.start_setup(environment.id)
        app.record_setup_outcome(environment.id, app.environment(environment.id).setup_operation_id, True, None)
        if n % 2:
            app.archive_thread(thread_id, NOW)
            app.start_removal(environment.id, NOW)
            app.start_teardown(environment.id)
            app.record_teardown_outcome(environment.id, app.environment(environment.id).teardown_operation_id,
                                        "succeeded", None)
            app.record_removed(environment.id, 1)


def batches(app: Environments, after: int = 0, size: int = 7) -> list[list[Applied]]:
    """The log after `after` as the projection consumer gets it: batches of (position, view)."""
    logged = LogReader(app).page(after, limit=10**6)
    items = [Applied(entry.notification_id, entry.notification_id, entry.view) for entry in logged]
    return [items[i:i + size] for i in range(0, len(items), size)]


def no_gap(*_: int) -> list:
    raise AssertionError("no gap to fill")


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
    forged = [item._replace(view=msgspec.structs.replace(item.view, status="forged"))
              for item in every[-5:] if isinstance(item.view, EnvironmentView)]
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
    stale = [item._replace(view=msgspec.structs.replace(item.view, status="forged"))
             for item in first if isinstance(item.view, EnvironmentView)]

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
        counts = await replay_log(store, fresh, LogReader(store.app), _stream_position)
        assert await state(fresh) == live and fresh.position == store.app.head()
        assert (counts.events, counts.environments, counts.threads) == (store.app.head(), 6, 6)
    finally:
        await fresh.close()

    await replay_log(store, read_model, LogReader(store.app), _stream_position)
    assert await state(read_model) == live


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

    async def read_page(after: int, upto: int | None) -> ViewPage:
        seen.append((read_model.position, await state(read_model)))
        if upto is None and len(seen) == 2:
            await go_on()  # read by the rebuild's next pages
        page = await store.read_log(reader.latest_views, after, upto, limit=5)
        if upto is None and not page.events:
            await go_on()  # after the rebuild's last page: it catches up with what was applied
        return page

    counts = await read_model.rebuild(read_page, _stream_position)

    assert len(seen) > 4
    assert all(listed == expected[position] for position, listed in seen)  # never a partial model
    assert read_model.position == store.app.head() == counts.events
    assert await state(read_model) == expected[read_model.position]
    assert counts.environments == 6


async def test_a_rebuild_cut_off_leaves_the_old_model_and_no_scratch_file(store, read_model, tmp_path):
    live_environments(store.app, 0, 3)
    for batch in batches(store.app):
        await read_model.apply(batch, no_gap)
    before, position = await state(read_model), read_model.position
    reader = LogReader(store.app)
    pages = 0

    async def read_page(after: int, upto: int | None) -> ViewPage:
        nonlocal pages
        pages += 1
        if pages == 3:
            raise OSError("the log's disk went away")
        return await store.read_log(reader.latest_views, after, upto, limit=5)

    with pytest.raises(OSError):
        await read_model.rebuild(read_page, _stream_position)

    assert await state(read_model) == before and read_model.position == position
    assert not (tmp_path / "read-models.sqlite.rebuilding").exists()


async def test_a_scratch_file_left_by_a_crash_is_deleted_at_open(tmp_path):
    scratch = tmp_path / "read-models.sqlite.rebuilding"
    scratch.write_bytes(b"half a rebuild")
    model = await ReadModel.open(tmp_path / "read-models.sqlite")
    await model.close()
    assert not scratch.exists()


async def _stream_position() -> int:
    return 0
