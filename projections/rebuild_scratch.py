"""A rebuild's scratch file: the read models written afresh from the whole log, on a worker thread
of their own, before projections/read_model.py swaps them in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from bb_environments.projections.tables import INSERT_ENVIRONMENTS, INSERT_THREADS, SCHEMA, latest_rows
from bb_environments.projections.views import ViewPage

PageReader = Callable[[int, "int | None"], ViewPage]
"""`read(after, upto)`: the log's next page after `after`, not past `upto` (None: the head).
Called on a worker thread of the rebuild's own, never on the event loop."""

T = TypeVar("T")


class RebuildAbandoned(Exception):
    pass


class Scratch:
    """A rebuild's scratch file. It is read, folded and written on one worker thread of its own,
    with plain sqlite3: handing each page between a reader thread, the event loop and aiosqlite's
    thread cost a replay more than the writes (they share one interpreter lock). Every call runs on
    that thread, one after another: a rebuild cancelled mid-page stops at the end of that page, and
    only then is the file closed and deleted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-model-rebuild")
        self._discarded = threading.Event()
        self._abandoned = False

    async def create(self) -> None:
        await self._on_worker(self._create)

    async def write_pages(self, read_page: PageReader, after: int, upto: int | None = None) -> tuple[int, int]:
        """Write the views of the log after `after` (up to `upto`); the number of events read and
        the position reached."""
        written = await self._on_worker(functools.partial(self._write_pages, read_page, after, upto))
        self._check_not_abandoned()  # else what was written may be a part, or deleted meanwhile
        return written

    async def close(self) -> None:
        """Commit what was written and close the file, for the swap to read it."""
        await self._on_worker(self._close)
        self._check_not_abandoned()

    async def discard(self) -> None:
        """Close the file if open and delete it; the thread ends."""
        if self._abandoned:
            return  # the worker is gone, and the file with it
        self._discarded.set()
        try:
            await self._on_worker(self._discard)
        finally:
            self._worker.shutdown(wait=False)

    async def abandon(self) -> None:
        """Stop at the end of the page being written, wait for the worker, delete the file: for a
        close that must not leave the worker reading, whatever became of the rebuild's task, which
        fails at its next step."""
        self._abandoned = True
        self._discarded.set()
        await asyncio.to_thread(self._worker.shutdown, wait=True)
        self._discard()

    def _on_worker(self, call: Callable[[], T]) -> asyncio.Future[T]:
        self._check_not_abandoned()
        return asyncio.get_running_loop().run_in_executor(self._worker, call)

    def _check_not_abandoned(self) -> None:
        if self._abandoned:
            raise RebuildAbandoned("the read models closed during the rebuild (the service is stopping)")

    def _create(self) -> None:
        self.path.unlink(missing_ok=True)
        # Used on the worker only, but for `abandon`, which closes it once the worker has ended.
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        # Nothing in it is needed after a crash (the next open deletes it): no journal, no fsync.
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.executescript(SCHEMA)

    def _write_pages(self, read_page: PageReader, after: int, upto: int | None) -> tuple[int, int]:
        assert self._db is not None, "written before it was created"
        events, reached = 0, after
        with _collector_paused():
            while not self._discarded.is_set() and (page := read_page(reached, upto)).events:
                environments, threads = latest_rows(page.views)
                self._db.executemany(INSERT_ENVIRONMENTS, environments)
                self._db.executemany(INSERT_THREADS, threads)
                events, reached = events + page.events, page.reached
        return events, reached

    def _close(self) -> None:
        if self._db is not None:
            self._db.commit()
            self._db.close()
            self._db = None

    def _discard(self) -> None:
        if self._db is not None:
            self._db.close()  # without its commit: nothing in it is kept
            self._db = None
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the process meanwhile. A rebuild allocates millions of
    short-lived objects and frees them all by reference counting (it leaves no cycles), yet they set
    off collections that walk the whole heap of a service holding thousands of aggregates. A replay
    asked of a running service pauses them for its event loop too, for the seconds the pages take."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def scratch_file(path: Path) -> Path:
    return path.with_name(f"{path.name}.rebuilding")
