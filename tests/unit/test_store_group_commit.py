"""The store's one writer takes commands that queue up together as one batch with one disk sync:
each command still sees what the ones before it wrote, a failing one costs the others nothing,
and whoever forwards new events hears of them only once the batch is written."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bb_environments.domain.errors import UnknownThread
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.store import Store


def application(path: Path) -> Environments:
    return Environments(env=event_store_environment(f"sqlite:///{path}"))


async def test_commands_queued_together_each_take_effect_and_a_failing_one_sinks_no_other(tmp_path: Path) -> None:
    store = Store(application(tmp_path / "events.sqlite"))
    woken_with: list[int] = []
    # What a woken relay would find in the log, read as the relay reads it (another connection).
    store.app.on_saved = lambda: woken_with.append(
        application(tmp_path / "events.sqlite").recorder.max_notification_id()
    )
    try:
        app = store.app
        calls = []
        for i in range(40):
            calls.append(store.run(app.register_thread, f"t{i}", None, None, "local", None))
            if i % 10 == 5:
                calls.append(store.run(app.thread, "nobody"))
            # Seen by the next command of the same batch: registering again finds the thread.
            calls.append(store.run(app.register_thread, f"t{i}", "/elsewhere", None, "local", None))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        store.close()

    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert len(failures) == 4 and all(isinstance(failure, UnknownThread) for failure in failures)
    registered = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    assert len(registered) == 80 and all(thread.project_path is None for thread in registered)

    reopened = application(tmp_path / "events.sqlite")
    assert sorted(thread.thread_id for thread in map(reopened.find_thread, [f"t{i}" for i in range(40)])) == sorted(
        f"t{i}" for i in range(40)
    )
    assert woken_with and woken_with[-1] == reopened.recorder.max_notification_id() == 40
    assert woken_with == sorted(woken_with) and len(woken_with) <= 40


async def test_a_command_queued_after_close_is_never_left_waiting(tmp_path: Path) -> None:
    store = Store(application(tmp_path / "events.sqlite"))
    pending = asyncio.ensure_future(store.run(store.app.register_thread, "t1", None, None, "local", None))
    await asyncio.sleep(0)  # queued before the close, so it runs before the writer stops
    store.close()
    assert (await asyncio.wait_for(pending, 5)).thread_id == "t1"
    assert application(tmp_path / "events.sqlite").find_thread("t1") is not None


async def test_a_wake_up_that_fails_after_a_save_leaves_the_writer_answering(tmp_path: Path) -> None:
    """The relay's wake-up runs on the writer thread after each batch's saves (at shutdown its loop
    may be closed): if it raised, the writer thread died and every later command waited for ever."""
    store = Store(application(tmp_path / "events.sqlite"))

    def failing_wake_up() -> None:
        raise RuntimeError("Event loop is closed")

    store.app.on_saved = failing_wake_up
    try:
        first = await asyncio.wait_for(store.run(store.app.register_thread, "t1", None, None, "local", None), 10)
        second = await asyncio.wait_for(store.run(store.app.register_thread, "t2", None, None, "local", None), 10)
    finally:
        store.close()
    assert (first.thread_id, second.thread_id) == ("t1", "t2")
