"""Which event store the core opens (the eventsourcing library's settings for BB_EVENT_STORE), and
the log read from it without a service.

The core's alone: a host agent keeps no event store, and this is where the event library's
modules come into a process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from bb_environments.entrypoints.config import ConfigError, sync_level


def event_store_environment(url: str) -> dict[str, str]:
    """The eventsourcing library's settings for `sqlite:///path` or `postgresql://...`."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = Path(unquote(parsed.path))
        path.parent.mkdir(parents=True, exist_ok=True)
        # The log holds environment inputs and thread ids: its owner's only, wherever it lives.
        path.touch(mode=0o600, exist_ok=True)
        os.chmod(path, 0o600)
        # eventsourcing's SQLite module, with the fsync level BB_EVENT_STORE_SYNC chooses (see there);
        # imported only here, since it loads eventsourcing, which no `bb` command but serve needs.
        from bb_environments.entrypoints import sqlite_event_store

        return {"PERSISTENCE_MODULE": f"{sqlite_event_store.__name__}:Factory", "SQLITE_DBNAME": str(path),
                sqlite_event_store.SQLITE_SYNCHRONOUS: sync_level("BB_EVENT_STORE_SYNC", sqlite_event_store.SYNC_LEVELS)}
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": parsed.path.lstrip("/"),
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or ""),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
        }
    raise ConfigError(f"BB_EVENT_STORE {parsed.scheme!r} is not supported: use sqlite:///path or postgresql://...")


class StoredLog:
    """The log's documents, as the relay publishes them, read from the store itself (for `bb events
    export`: all of it while no service runs, and what the stream no longer holds while one does).
    A SQLite store that does not exist is ConfigError, never a new empty file."""

    def __init__(self, url: str) -> None:
        from bb_environments.bus.core.log_reader import LogReader
        from bb_environments.entrypoints.config import event_store_file
        from bb_environments.handlers.application import Environments

        store = event_store_file(url)
        if store is not None and not store.is_file():
            raise ConfigError(f"there is no event store at {store}: nothing was ever served from it")
        self._app = Environments(env=event_store_environment(url))
        self._reader = LogReader(self._app)

    def payloads(self, after: int = 0, upto: int | None = None, page: int = 500) -> Iterator[bytes]:
        """The documents after notification `after`, up to and including `upto` (None: the head)."""
        while documents := self._reader.page(after, page if upto is None else min(page, upto - after)):
            yield from (logged.payload() for logged in documents if upto is None or logged.notification_id <= upto)
            after = documents[-1].notification_id
            if upto is not None and after >= upto:
                return

    def close(self) -> None:
        self._app.close()

