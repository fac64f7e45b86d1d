"""The asyncio face of the event store: every command runs on one writer thread, off the loop.

Reads of the notification log (the relay's pages, gap fills, the log's head) run on a reader
thread of their own, on another connection: they see only committed events, and a command never
waits behind a page of them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from bb_environments.domain.application import Environments, RecordedHook

T = TypeVar("T")
P = ParamSpec("P")


class Store:
    def __init__(self, app: Environments) -> None:
        self.app = app
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-store")
        self._log_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-log-reader")

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a command on the writer thread; its arguments are checked against `call`'s signature."""
        return await _in(self._writer, call, *args, **kwargs)

    async def read_log(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read of the notification log (never a command) on the reader thread."""
        return await _in(self._log_reader, call, *args, **kwargs)

    def close(self) -> None:
        self._log_reader.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        self.app.close()


async def _in(executor: ThreadPoolExecutor, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    # run_in_executor passes positional arguments only; a partial carries keywords too.
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(call, *args, **kwargs))


class StoreLedger:
    """The host agent's account of hook operations when it runs beside the store (`bb serve`)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def recorded_hook(self, operation_id: str) -> RecordedHook | None:
        # On the writer thread: the application's indexes and aggregate cache are the writer's alone,
        # and a step the core recorded before asking the agent is already there.
        return await self._store.run(self._store.app.recorded_hook, operation_id)
