"""The SQLite event store, as the eventsourcing library keeps it, with a chosen durability.

The library opens the database in WAL mode and leaves SQLite's `synchronous=FULL`, which fsyncs the
write-ahead log at every commit: a few milliseconds each, three times between a spawn and `ready`.
Here every connection commits with `synchronous=NORMAL`, and the level decides whether the store's
writer then syncs the log once per batch of commands (handlers/store.py, group commit).
What the service promises (docs/guarantees.md) is that every step is safe after a kill -9 of
`bb serve` at any line. In WAL mode a commit has written its frames into the WAL file before it
returns, so with `synchronous=NORMAL` a committed transaction survives the death of the process:
the operating system holds the write and the next open replays the WAL. What NORMAL gives up is a
power loss or an operating-system crash: the transactions committed since the last checkpoint may
then be lost (the database stays consistent, never torn), while their effects outside the store (a
worktree created, a message relayed) remain. `BB_EVENT_STORE_SYNC=full` puts every batch on disk
before any of its commands is answered, for a machine where that matters.
"""

from __future__ import annotations

import os

from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteFactory
from eventsourcing.utils import Environment, EnvType

SYNC_LEVELS = ("normal", "full")
SQLITE_SYNCHRONOUS = "SQLITE_SYNCHRONOUS"


class _DeferredSyncPool(SQLiteConnectionPool):
    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        # A per-connection setting: every connection of the pool, the writer's and the readers', gets it.
        connection.cursor().execute("PRAGMA synchronous=NORMAL")
        return connection


class Factory(SQLiteFactory):
    """eventsourcing's SQLite factory whose commits wait for the disk only in `sync_to_disk`, and
    only when `SQLITE_SYNCHRONOUS` is full."""

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        synchronous = (self.env.get(SQLITE_SYNCHRONOUS) or "full").lower()
        if synchronous not in SYNC_LEVELS:
            raise OSError(f"{SQLITE_SYNCHRONOUS} {synchronous!r} is not one of {', '.join(SYNC_LEVELS)}")
        self._synced = synchronous == "full"
        pool = self.datastore.pool
        # Beside the file a link names, where SQLite keeps it.
        self._write_ahead_log = f"{os.path.realpath(pool.db_name)}-wal"
        # Replaced before anything connected: the library's pool opens its connections lazily.
        self.datastore.pool = _DeferredSyncPool(
            db_name=pool.db_name, lock_timeout=pool.lock_timeout, pool_size=pool.pool_size,
            max_overflow=pool.max_overflow, pool_timeout=pool.pool_timeout, max_age=pool.max_age,
            pre_ping=pool.pre_ping,
        )

    def sync_to_disk(self) -> None:
        """Put every commit so far on disk, where the level promises it."""
        if not self._synced or self.datastore.pool.is_sqlite_memory_mode:
            return
        descriptor = os.open(self._write_ahead_log, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
