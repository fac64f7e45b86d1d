"""The asyncio face of the event store: every call runs on one writer thread, off the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from domain.application import Environments

T = TypeVar("T")


class Store:
    def __init__(self, app: Environments) -> None:
        self.app = app
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-store")

    async def run(self, call: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, call, *args)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self.app.close()
