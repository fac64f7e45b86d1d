"""Which event store the core opens (the eventsourcing library's settings for BB_EVENT_STORE), and
the log read from it without a service: exported, or replayed into the read models.

The core's alone: a host agent keeps no event store, and this is where the event library's
modules come into a process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bb_environments.entrypoints.config import ConfigError, Settings, sync_level

if TYPE_CHECKING:  # the read models' module loads aiosqlite, the application eventsourcing: only here
    from bb_environments.handlers.application import Environments
    from bb_environments.projections.read_model import ReplayCounts


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

        return {
            "PERSISTENCE_MODULE": f"{sqlite_event_store.__name__}:Factory",
            "SQLITE_DBNAME": str(path),
            sqlite_event_store.SQLITE_SYNCHRONOUS: sync_level("BB_EVENT_STORE_SYNC", sqlite_event_store.SYNC_LEVELS),
        }
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": parsed.path.lstrip("/"),
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or ""),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
            # Every insert locks the table; the library's default waits forever for that lock, so one
            # replica stuck in a transaction would hold up every other's saves. Bounded, the save
            # fails and the library tries it again.
            "POSTGRES_LOCK_TIMEOUT": "5",
        }
    raise ConfigError(f"BB_EVENT_STORE {parsed.scheme!r} is not supported: use sqlite:///path or postgresql://...")


class StoredLog:
    """The log's documents, as the relay publishes them, read from the store itself (for `bb events
    export`: all of it while no service runs, and what the stream no longer holds while one does).
    A SQLite store that does not exist is ConfigError, never a new empty file."""

    def __init__(self, url: str) -> None:
        from bb_environments.bus.core.log_reader import LogReader

        self._app = _stored_log_app(url)
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


async def replay_stored(settings: Settings) -> ReplayCounts | None:
    """Rebuild the read models of `settings`' data dir from the event store itself (`bb events
    replay` while no service runs), as the service does: into a scratch file, then swapped in.

    The data dir's lock is held meanwhile, so a `bb serve` starting then is refused rather than
    reading a model half rebuilt; None when a service took the data dir first (ask it). The transcript
    tails are not in the log and stay as they were; the stream position the model last reached is
    kept, since only the running service can read the stream."""
    from bb_environments.bus.core.log_reader import LogReader
    from bb_environments.entrypoints.config import SERVE_LOCK, Holder
    from bb_environments.projections.read_model import ReadModel
    from bb_environments.providers.host.file_lock import FileLock

    app = _stored_log_app(settings.event_store)
    if not settings.data_dir.is_dir():
        app.close()
        raise ConfigError(f"there is no data dir {settings.data_root}: nothing was ever served from it")
    lock = FileLock(settings.data_dir / SERVE_LOCK)
    try:
        if not lock.acquire():
            return None
        lock.record(Holder(os.getpid(), settings.data_root))
        read_model, _ = await ReadModel.open_or_set_aside(settings.data_dir / "read-models.sqlite")
        try:
            return await read_model.rebuild(LogReader(app).latest_views, _no_stream_position)
        finally:
            await read_model.close()
    finally:
        lock.close()
        app.close()


async def _no_stream_position() -> int:
    return 0  # the swap keeps the larger of this and the stream position the model had reached


def _stored_log_app(url: str) -> Environments:
    """The application on the store `url` names, to read its log; a SQLite store that does not
    exist is ConfigError, never a new empty file."""
    from bb_environments.entrypoints.config import event_store_file
    from bb_environments.handlers.application import Environments

    store = event_store_file(url)
    if store is not None and not store.is_file():
        raise ConfigError(f"there is no event store at {store}: nothing was ever served from it")
    return Environments(env=event_store_environment(url))
