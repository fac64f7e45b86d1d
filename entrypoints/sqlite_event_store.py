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
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal, NamedTuple
from uuid import UUID

from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteConnection, SQLiteDatastore, SQLiteFactory
from eventsourcing.utils import Environment, EnvType

SYNC_LEVELS = ("normal", "full")
SQLITE_SYNCHRONOUS = "SQLITE_SYNCHRONOUS"
# Each aggregate id made once, not once per page: an aggregate's events span pages, and one UUID
# object for all its events makes the log reader's id check an identity check.
_CACHED_IDS = 16384


class LogRow(NamedTuple):
    """A notification of the log as `select_rows` reads it (a StoredNotification, projections/fold.py)."""

    id: int
    originator_id: UUID | str
    originator_version: int
    topic: str
    state: bytes


_new_row = tuple.__new__


class LogRowsRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder, with the log also read as plain rows
    (`select_rows`): the library's `select_notifications` builds a frozen dataclass and a new UUID
    for every row, which cost a replay more than decoding and folding the event."""

    def __init__(self, datastore: SQLiteDatastore, events_table_name: str = "stored_events") -> None:
        super().__init__(datastore, events_table_name)
        self._select_rows_statement = (
            f"SELECT rowid, originator_id, originator_version, topic, state FROM {self.events_table_name} "
            "WHERE rowid >= ? AND rowid <= ? ORDER BY rowid LIMIT ?"
        )
        self._ids: dict[str, UUID | str] = {}

    def select_rows(self, start: int, limit: int, stop: int | None = None) -> Sequence[LogRow]:
        """The notifications from `start` on, up to `stop` (None: the head), at most `limit` of them."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.sqlite_cursor.row_factory = None  # tuples: a sqlite3.Row is read by position anyway
            cursor.execute(self._select_rows_statement, (start, (1 << 63) - 1 if stop is None else stop, limit))
            rows = cursor.fetchall()
        ids = self._ids
        if len(ids) > _CACHED_IDS:
            ids.clear()
        convert = self.convert_originator_id
        # tuple.__new__ makes a LogRow without the Python call LogRow(...) makes per row.
        return [
            _new_row(
                LogRow, (row[0], ids.get(row[1]) or ids.setdefault(row[1], convert(row[1])), row[2], row[3], row[4])
            )
            for row in rows
        ]


class DeferredSyncDatastore(SQLiteDatastore):
    """eventsourcing's SQLite datastore whose every connection, the writer's and the readers',
    commits with `synchronous=NORMAL` (a per-connection setting, made once per connection)."""

    def __init__(
        self,
        db_name: str,
        *,
        lock_timeout: int | None,
        single_row_tracking: bool,
        originator_id_type: Literal["uuid", "text"],
    ) -> None:
        super().__init__(
            db_name,
            lock_timeout=lock_timeout,
            single_row_tracking=single_row_tracking,
            originator_id_type=originator_id_type,
        )
        self._deferred: weakref.WeakSet[SQLiteConnection] = weakref.WeakSet()

    @contextmanager
    def get_connection(self, *, commit: bool) -> Iterator[SQLiteConnection]:
        with super().get_connection(commit=commit) as connection:
            if connection not in self._deferred:
                connection.cursor().execute("PRAGMA synchronous=NORMAL")
                self._deferred.add(connection)
            yield connection


class Factory(SQLiteFactory):
    """eventsourcing's SQLite factory whose commits wait for the disk only in `sync_to_disk`, and
    only when `SQLITE_SYNCHRONOUS` is full, and whose recorder reads the log as rows."""

    application_recorder_class = LogRowsRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        synchronous = (self.env.get(SQLITE_SYNCHRONOUS) or "full").lower()
        if synchronous not in SYNC_LEVELS:
            raise OSError(f"{SQLITE_SYNCHRONOUS} {synchronous!r} is not one of {', '.join(SYNC_LEVELS)}")
        self._synced = synchronous == "full"
        # The library's factory reads its settings into the datastore it makes; the same settings
        # make ours, before anything connected (the library's pool opens its connections lazily).
        made = self.datastore
        self.datastore = DeferredSyncDatastore(
            made.pool.db_name,
            lock_timeout=made.pool.lock_timeout,
            single_row_tracking=made.single_row_tracking,
            originator_id_type=made.originator_id_type,
        )
        made.close()
        # Beside the file a link names, where SQLite keeps it.
        self._write_ahead_log = f"{os.path.realpath(self.datastore.pool.db_name)}-wal"

    def sync_to_disk(self) -> None:
        """Put every commit so far on disk, where the level promises it."""
        if not self._synced or self.datastore.pool.is_sqlite_memory_mode:
            return
        descriptor = os.open(self._write_ahead_log, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
