"""The SQLite read models (environments, threads, transcript) and the queries over them.

The log's notifications come with the public view of their aggregate just after them (see
bus.log_reader); the read model stores that view as it is, and folds nothing itself. Every batch
is applied in one transaction together with the notification id and stream sequence it reached,
so a restart neither skips nor double-applies; a notification at or below the stored position is
ignored. Of the views in one batch only each aggregate's last is written: it replaces the others.

A rebuild (`bb events replay`, or a start that lost the read models) runs beside the live
consumer: it writes a new model into a scratch file (projections/rebuild_scratch.py) and swaps it
in, in one transaction. The tables and the rows a view makes are in projections/tables.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import aiosqlite
import msgspec

from bb_environments.domain.status import EnvironmentStatus, ThreadStatus
from bb_environments.projections.rebuild_scratch import PageReader, Scratch, scratch_file
from bb_environments.projections.tables import (
    IS_REMOVED,
    LIVE_INDEXES,
    LOG,
    LOG_FOLLOWED,
    REMOVED_AT,
    SCHEMA,
    TRANSCRIPT,
    View,
    write_views,
)
from bb_environments.projections.views import EnvironmentView, ThreadView, TranscriptEntry
from bb_environments.providers.host.crash_points import crash_point

TRANSCRIPT_LINES_KEPT = 500


class Applied(NamedTuple):
    notification_id: int
    stream_sequence: int
    view: View


GapFiller = Callable[[int, int], Awaitable[list[tuple[int, View]]]]


class ReplayCounts(msgspec.Struct, rename="camel"):
    events: int
    environments: int
    threads: int


class DamagedReadModel(Exception):
    pass


class ReadModel:
    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self._path = path
        self._advanced = asyncio.Condition()
        self._writing = asyncio.Lock()  # see _transaction
        self._rebuilding = asyncio.Lock()
        self._scratch: Scratch | None = None  # a rebuild's, while one runs
        self.position = 0

    @classmethod
    async def open(cls, path: Path) -> ReadModel:
        """Raises DamagedReadModel when the file is not a database or fails SQLite's quick check."""
        scratch_file(path).unlink(missing_ok=True)  # a rebuild's, cut off by a crash
        db = await aiosqlite.connect(path)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            async with db.execute("PRAGMA quick_check") as rows:
                problems = [row[0] for row in await rows.fetchall() if row[0] != "ok"]
            if problems:
                raise DamagedReadModel(problems[0])
            # Disposable and rebuilt from the log: no fsync per commit. A commit lost to a power cut
            # leaves a gap below the next document, which `apply` fills from the log.
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.executescript(SCHEMA + LIVE_INDEXES)
            await db.commit()
            model = cls(db, path)
            model.position = (await model.stored_position(LOG))[0]
        except sqlite3.DatabaseError as unreadable:
            await db.close()  # its thread would keep the process alive
            raise DamagedReadModel(str(unreadable)) from unreadable
        except BaseException:
            await db.close()
            raise
        return model

    @classmethod
    async def open_or_set_aside(cls, path: Path) -> tuple[ReadModel, str | None]:
        """The read models, or new empty ones in place of a damaged file, which is moved aside as
        `<name>.corrupt-<UTC time>` and named in the second value (why, and where it went)."""
        try:
            return await cls.open(path), None
        except DamagedReadModel as damaged:
            aside = path.with_name(f"{path.name}.corrupt-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
            # Its WAL and shared-memory files too: SQLite would apply that WAL to the new file.
            for suffix in ("", "-wal", "-shm"):
                if os.path.lexists(f"{path}{suffix}"):
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            return await cls.open(path), f"{path.name} could not be read ({damaged}); moved it to {aside.name}"

    async def close(self) -> None:
        """Close, once a rebuild's worker has stopped (it reads the event store, which closes next)
        and what writes holds the connection no more (a transaction, or a rebuild's swap)."""
        if self._scratch is not None:
            await self._scratch.abandon()
        async with self._writing:
            await self._db.close()

    async def stored_position(self, name: str) -> tuple[int, int]:
        row = await self._row("SELECT notification_id, stream_sequence FROM positions WHERE name = ?", (name,))
        return (row[0], row[1]) if row else (0, 0)

    async def followed(self) -> int:
        """The stream sequence after which the log's follower goes on: where it finished a batch,
        else (a read model new or rebuilt) as far as the read model holds the log."""
        row = await self._row("SELECT stream_sequence FROM positions WHERE name = ?", (LOG_FOLLOWED,))
        return row[0] if row else (await self.stored_position(LOG))[1]

    # -- writing -------------------------------------------------------------------------------

    async def note_followed(self, stream_sequence: int) -> None:
        async with self._transaction():
            await self._db.execute(
                "INSERT INTO positions VALUES (?, 0, ?) ON CONFLICT(name) DO UPDATE SET "
                "stream_sequence = excluded.stream_sequence",
                (LOG_FOLLOWED, stream_sequence),
            )

    async def apply(self, batch: Iterable[Applied], fill: GapFiller) -> None:
        """Apply a batch of views in log order, exactly once each, in one transaction.

        A consumer may see the log out of order (a message delivered to a process that died is
        redelivered only after its ack wait, behind later ones): a gap below a document is filled
        from the log itself (`fill(after, upto)`) before the document is applied.
        """
        items = sorted(batch, key=lambda item: item.notification_id)
        if not items:
            return
        async with self._transaction():
            reached = self.position
            views: list[View] = []
            for item in items:
                if item.notification_id <= reached:
                    continue
                if item.notification_id > reached + 1:
                    views.extend(view for _, view in await fill(reached, item.notification_id - 1))
                views.append(item.view)
                reached = item.notification_id
            await write_views(self._db, views)
            await self._db.execute(
                "INSERT INTO positions VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                "notification_id = excluded.notification_id, stream_sequence = excluded.stream_sequence",
                (LOG, reached, max(item.stream_sequence for item in items)),
            )
        await self._advance(reached)

    async def _advance(self, reached: int) -> None:
        async with self._advanced:
            self.position = reached
            self._advanced.notify_all()

    async def add_transcript(self, lines: list[TranscriptEntry]) -> None:
        """Store transcript lines, keeping the newest per environment."""
        if not lines:
            return
        touched = {line.environment_id for line in lines}
        async with self._transaction():
            await self._db.executemany(
                "INSERT OR IGNORE INTO transcript VALUES (?, ?, ?)",
                [(line.environment_id, line.sequence, _render(line)) for line in lines],
            )
            # One statement for all: each call is a trip to the connection's thread, and a batch in a
            # burst touches as many environments as it has lines.
            await self._db.executemany(
                "DELETE FROM transcript WHERE environment_id = ? AND sequence NOT IN (SELECT sequence FROM "
                "transcript WHERE environment_id = ? ORDER BY sequence DESC LIMIT ?)",
                [(environment_id, environment_id, TRANSCRIPT_LINES_KEPT) for environment_id in touched],
            )
            await self._db.execute(
                "INSERT INTO positions VALUES (?, 0, ?) ON CONFLICT(name) DO UPDATE SET "
                "stream_sequence = excluded.stream_sequence",
                (TRANSCRIPT, lines[-1].sequence),
            )

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        """A write transaction, committed at the end or rolled back, and one at a time: on the
        shared connection a commit by one writer would also commit another's unfinished one."""
        async with self._writing:
            try:
                yield
                await self._db.commit()
            except BaseException:
                await self._db.rollback()
                raise

    async def rebuild(self, read_page: PageReader, stream_position: Callable[[], Awaitable[int]]) -> ReplayCounts:
        """Rebuild the log-derived read models from the whole log while they keep serving.

        They are built afresh in a scratch file, page by page, then brought up to what the live
        consumer applied meanwhile, and copied over the live tables in one transaction. Until it
        commits, list and show answer from the old tables; a crash anywhere before leaves them
        as they were (and the scratch file, which the next open deletes).
        """
        async with self._rebuilding:
            scratch = self._scratch = Scratch(scratch_file(self._path))
            try:
                await scratch.create()
                events, reached = await scratch.write_pages(read_page, 0)
                crash_point("replay-built")
                sequence = await stream_position()
                async with self._writing:  # the live consumer waits from here to the swap
                    if self.position > reached:
                        more, reached = await scratch.write_pages(read_page, reached, self.position)
                        events += more
                    reached = max(reached, self.position)
                    await scratch.close()
                    self._scratch = None  # its worker is done: a close from here waits for the swap instead
                    await self._swap_in(scratch.path, reached, sequence)
                    crash_point("replay-swapped")
                    await self._advance(reached)
                    return ReplayCounts(
                        events=events,
                        environments=await self._count("environments"),
                        threads=await self._count("threads"),
                    )
            finally:
                self._scratch = None
                await scratch.discard()

    async def _swap_in(self, scratch_path: Path, reached: int, sequence: int) -> None:
        """Replace the log-derived tables by the scratch file's, and the position, in one
        transaction, in one call: no query on this connection runs between its statements."""
        await self._db.execute("ATTACH DATABASE ? AS rebuilt", (str(scratch_path),))
        try:
            await self._db.executescript(f"""
                BEGIN IMMEDIATE;
                DELETE FROM main.environments;
                INSERT INTO main.environments SELECT * FROM rebuilt.environments ORDER BY rowid;
                DELETE FROM main.threads;
                INSERT INTO main.threads SELECT * FROM rebuilt.threads ORDER BY rowid;
                INSERT INTO main.positions VALUES ('{LOG}', {int(reached)}, {int(sequence)})
                    ON CONFLICT(name) DO UPDATE SET notification_id = excluded.notification_id,
                    stream_sequence = max(stream_sequence, excluded.stream_sequence);
                COMMIT;
            """)
        except BaseException:
            await self._db.rollback()
            raise
        finally:
            await self._db.execute("DETACH DATABASE rebuilt")

    async def _count(self, table: str) -> int:
        row = await self._row(f"SELECT count(*) FROM {table}")
        assert row is not None  # count(*) answers one row, even for an empty table
        return int(row[0])

    # -- reading -------------------------------------------------------------------------------

    async def _rows(self, query: str, parameters: Sequence[object] = ()) -> list[sqlite3.Row]:
        """All of a query's rows in one call on the connection's thread, so that no query is left
        half read while another coroutine's call runs: a rebuild's swap could not detach its
        scratch file from the connection then, and would replace the tables under the reader."""
        return list(await self._db.execute_fetchall(query, parameters))

    async def _row(self, query: str, parameters: Sequence[object] = ()) -> sqlite3.Row | None:
        rows = await self._rows(query, parameters)
        return rows[0] if rows else None

    async def wait_for(self, position: int, timeout: float = 10) -> None:
        """Read-your-writes: return once the model has applied the log up to `position`."""
        async with self._advanced:
            await asyncio.wait_for(self._advanced.wait_for(lambda: self.position >= position), timeout)

    async def environment(self, environment_id: str) -> EnvironmentView | None:
        row = await self._row("SELECT document FROM environments WHERE id = ?", (environment_id,))
        return msgspec.json.decode(row[0], type=EnvironmentView) if row else None

    async def environment_ids_starting(self, prefix: str, limit: int) -> list[str]:
        """The ids (removed environments' too) that begin with `prefix`, in order, at most `limit`:
        a range of the primary key's index, as every character of an id sorts before DEL."""
        rows = await self._rows(
            "SELECT id FROM environments WHERE id >= ? AND id < ? ORDER BY id LIMIT ?", (prefix, prefix + "\x7f", limit)
        )
        return [row[0] for row in rows]

    async def environments(
        self,
        status: str | None = None,
        provider_id: str | None = None,
        include_removed: bool = True,
        after: str | None = None,
        limit: int = -1,
    ) -> list[EnvironmentView]:
        """In id order (the primary key's index), from the first id past `after`: a page costs its
        own rows, however many come before it. `limit` -1: all of them."""
        query, args = "SELECT document FROM environments WHERE id > ?", [after or ""]
        if not include_removed:
            query, args = query + " AND status != ?", [*args, EnvironmentStatus.REMOVED]
        if status:
            query, args = query + " AND status = ?", [*args, status]
        if provider_id:
            query, args = query + " AND provider_id = ?", [*args, provider_id]
        rows = await self._rows(query + " ORDER BY id LIMIT ?", [*args, limit])
        return [msgspec.json.decode(r[0], type=EnvironmentView) for r in rows]

    async def live_environments_by_host(self) -> dict[str, int]:
        """How many environments that are not removed each host holds."""
        query = (
            "SELECT json_extract(CAST(document AS TEXT), '$.hostId'), count(*) FROM environments"
            " WHERE status != ? GROUP BY 1"
        )
        return {host_id: count for host_id, count in await self._rows(query, [EnvironmentStatus.REMOVED])}

    async def thread(self, thread_id: str) -> ThreadView | None:
        row = await self._row("SELECT document FROM threads WHERE id = ?", (thread_id,))
        return msgspec.json.decode(row[0], type=ThreadView) if row else None

    async def threads(
        self, environment_id: str | None = None, after: str | None = None, limit: int = -1
    ) -> list[ThreadView]:
        """In id order, from the first id past `after` (see `environments`)."""
        query, args = "SELECT document FROM threads WHERE id > ?", [after or ""]
        if environment_id:
            query, args = query + " AND environment_id = ?", [*args, environment_id]
        rows = await self._rows(query + " ORDER BY id LIMIT ?", [*args, limit])
        return [msgspec.json.decode(r[0], type=ThreadView) for r in rows]

    async def removed_before(self, cutoff: datetime, limit: int) -> list[EnvironmentView]:
        """Environments removed before `cutoff`, at most `limit` of them, the earliest removed first."""
        rows = await self._rows(
            # Through the index of removed environments by time: the other documents are never read.
            f"SELECT document FROM environments WHERE {IS_REMOVED} AND {REMOVED_AT} < ? ORDER BY {REMOVED_AT} LIMIT ?",
            (msgspec.json.encode(cutoff).decode().strip('"'), limit),
        )
        return [msgspec.json.decode(r[0], type=EnvironmentView) for r in rows]

    async def forget_transcripts(self, environment_ids: list[str]) -> None:
        async with self._transaction():
            await self._db.executemany(
                "DELETE FROM transcript WHERE environment_id = ?",
                [(environment_id,) for environment_id in environment_ids],
            )

    async def forget_environments(self, environment_ids: list[str]) -> None:
        """Drop removed environments: their rows, their transcript lines, and the rows of the
        archived threads last on them (a thread placed again since is on another environment)."""
        rows = [(environment_id,) for environment_id in environment_ids]
        async with self._transaction():
            await self._db.executemany(f"DELETE FROM environments WHERE id = ? AND {IS_REMOVED}", rows)
            # Only of those gone now: an environment that is not removed keeps everything.
            gone = "NOT EXISTS (SELECT 1 FROM environments WHERE id = ?)"
            await self._db.executemany(
                f"DELETE FROM transcript WHERE environment_id = ? AND {gone}", [row * 2 for row in rows]
            )
            await self._db.executemany(
                f"DELETE FROM threads WHERE environment_id = ? AND {gone} AND "
                f"json_extract(CAST(document AS TEXT), '$.status') = '{ThreadStatus.ARCHIVED.value}'",
                [row * 2 for row in rows],
            )

    async def transcript(self, environment_id: str, last: int = 50) -> list[str]:
        rows = await self._rows(
            "SELECT line FROM (SELECT sequence, line FROM transcript WHERE environment_id = ? "
            "ORDER BY sequence DESC LIMIT ?) ORDER BY sequence",
            (environment_id, last),
        )
        return [r[0] for r in rows]


def _render(line: TranscriptEntry) -> str:
    return f"» {line.text}" if line.is_step else line.text
