"""The SQLite read models (environments, threads, transcript) and the queries over them.

The log's notifications come with the public view of their aggregate just after them (see
bus.log_reader); the read model stores that view as it is, and folds nothing itself. Every batch
is applied in one transaction together with the notification id and stream sequence it reached,
so a restart neither skips nor double-applies; a notification at or below the stored position is
ignored.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import aiosqlite
import msgspec

from bb_environments.bus import documents as d
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.projections.views import EnvironmentView, ThreadView

TRANSCRIPT_LINES_KEPT = 500

SCHEMA = """
CREATE TABLE IF NOT EXISTS environments (
    id TEXT PRIMARY KEY, status TEXT NOT NULL, provider_id TEXT NOT NULL, document BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS threads (id TEXT PRIMARY KEY, environment_id TEXT, document BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS threads_by_environment_then_id ON threads (environment_id, id);
DROP INDEX IF EXISTS threads_by_environment;
CREATE TABLE IF NOT EXISTS transcript (
    environment_id TEXT NOT NULL, sequence INTEGER NOT NULL, line TEXT NOT NULL,
    PRIMARY KEY (environment_id, sequence));
CREATE TABLE IF NOT EXISTS positions (
    name TEXT PRIMARY KEY, notification_id INTEGER NOT NULL, stream_sequence INTEGER NOT NULL);
"""

LOG = "log"
TRANSCRIPT = "transcript"


View = EnvironmentView | ThreadView | None
"""An aggregate's public view just after a notification (None: the read model keeps nothing of it)."""


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
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self._advanced = asyncio.Condition()
        self.position = 0

    @classmethod
    async def open(cls, path: Path) -> ReadModel:
        """Raises DamagedReadModel when the file is not a database or fails SQLite's quick check."""
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
            await db.executescript(SCHEMA)
            await db.commit()
            model = cls(db)
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
            aside = path.with_name(f"{path.name}.corrupt-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
            # Its WAL and shared-memory files too: SQLite would apply that WAL to the new file.
            for suffix in ("", "-wal", "-shm"):
                if os.path.lexists(f"{path}{suffix}"):
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            return await cls.open(path), f"{path.name} could not be read ({damaged}); moved it to {aside.name}"

    async def close(self) -> None:
        await self._db.close()

    async def stored_position(self, name: str) -> tuple[int, int]:
        async with self._db.execute(
            "SELECT notification_id, stream_sequence FROM positions WHERE name = ?", (name,)
        ) as rows:
            row = await rows.fetchone()
        return (row[0], row[1]) if row else (0, 0)

    # -- writing -------------------------------------------------------------------------------

    async def apply(self, batch: Iterable[Applied], fill: GapFiller) -> None:
        """Apply views in log order, exactly once each.

        A consumer may see the log out of order (a message delivered to a process that died is
        redelivered only after its ack wait, behind later ones): a gap below a document is filled
        from the log itself (`fill(after, upto)`) before the document is applied.
        """
        items = sorted(batch, key=lambda item: item.notification_id)
        if not items:
            return
        reached = self.position
        for item in items:
            if item.notification_id <= reached:
                continue
            if item.notification_id > reached + 1:
                for notification_id, view in await fill(reached, item.notification_id - 1):
                    await self._apply_one(view)
                    reached = notification_id
            await self._apply_one(item.view)
            reached = item.notification_id
        await self._db.execute(
            "INSERT INTO positions VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "notification_id = excluded.notification_id, stream_sequence = excluded.stream_sequence",
            (LOG, reached, max(item.stream_sequence for item in items)),
        )
        await self._db.commit()
        await self._advance(reached)

    async def _advance(self, reached: int) -> None:
        async with self._advanced:
            self.position = reached
            self._advanced.notify_all()

    async def _apply_one(self, view: View) -> None:
        if isinstance(view, EnvironmentView):
            await self._db.execute(
                "INSERT OR REPLACE INTO environments VALUES (?, ?, ?, ?)",
                (view.id, view.status, view.provider_id, msgspec.json.encode(view)),
            )
        elif isinstance(view, ThreadView):
            await self._db.execute(
                "INSERT OR REPLACE INTO threads VALUES (?, ?, ?)",
                (view.id, view.environment_id, msgspec.json.encode(view)),
            )

    async def add_transcript(self, lines: list[tuple[int, d.TranscriptLine]]) -> None:
        """Store transcript lines (stream sequence, line), keeping the newest per environment."""
        if not lines:
            return
        touched = {line.environment_id for _, line in lines}
        await self._db.executemany(
            "INSERT OR IGNORE INTO transcript VALUES (?, ?, ?)",
            [(line.environment_id, sequence, _render(line)) for sequence, line in lines],
        )
        for environment_id in touched:
            await self._db.execute(
                "DELETE FROM transcript WHERE environment_id = ? AND sequence NOT IN (SELECT sequence FROM "
                "transcript WHERE environment_id = ? ORDER BY sequence DESC LIMIT ?)",
                (environment_id, environment_id, TRANSCRIPT_LINES_KEPT),
            )
        await self._db.execute(
            "INSERT INTO positions VALUES (?, 0, ?) ON CONFLICT(name) DO UPDATE SET "
            "stream_sequence = excluded.stream_sequence",
            (TRANSCRIPT, lines[-1][0]),
        )
        await self._db.commit()

    async def rebuild(self, views: Iterable[tuple[int, View]], stream_sequence: int) -> ReplayCounts:
        """Drop the log-derived read models and apply the whole log's views again."""
        await self._db.execute("DELETE FROM environments")
        await self._db.execute("DELETE FROM threads")
        await self._db.execute("DELETE FROM positions WHERE name = ?", (LOG,))
        events = reached = 0
        for notification_id, view in views:
            await self._apply_one(view)
            events, reached = events + 1, notification_id
        await self._db.execute("INSERT INTO positions VALUES (?, ?, ?)", (LOG, reached, stream_sequence))
        await self._db.commit()
        await self._advance(reached)
        return ReplayCounts(events=events, environments=await self._count("environments"),
                            threads=await self._count("threads"))

    async def _count(self, table: str) -> int:
        async with self._db.execute(f"SELECT count(*) FROM {table}") as rows:
            row = await rows.fetchone()
            assert row is not None  # count(*) answers one row, even for an empty table
            return int(row[0])

    # -- reading -------------------------------------------------------------------------------

    async def wait_for(self, position: int, timeout: float = 10) -> None:
        """Read-your-writes: return once the model has applied the log up to `position`."""
        async with self._advanced:
            await asyncio.wait_for(self._advanced.wait_for(lambda: self.position >= position), timeout)

    async def environment(self, environment_id: str) -> EnvironmentView | None:
        async with self._db.execute("SELECT document FROM environments WHERE id = ?", (environment_id,)) as rows:
            row = await rows.fetchone()
        return msgspec.json.decode(row[0], type=EnvironmentView) if row else None

    async def environments(self, status: str | None = None, provider_id: str | None = None,
                           include_removed: bool = True, after: str | None = None,
                           limit: int = -1) -> list[EnvironmentView]:
        """In id order (the primary key's index), from the first id past `after`: a page costs its
        own rows, however many come before it. `limit` -1: all of them."""
        query, args = "SELECT document FROM environments WHERE id > ?", [after or ""]
        if not include_removed:
            query, args = query + " AND status != ?", [*args, EnvironmentStatus.REMOVED]
        if status:
            query, args = query + " AND status = ?", [*args, status]
        if provider_id:
            query, args = query + " AND provider_id = ?", [*args, provider_id]
        async with self._db.execute(query + " ORDER BY id LIMIT ?", [*args, limit]) as rows:
            return [msgspec.json.decode(r[0], type=EnvironmentView) for r in await rows.fetchall()]

    async def thread(self, thread_id: str) -> ThreadView | None:
        async with self._db.execute("SELECT document FROM threads WHERE id = ?", (thread_id,)) as rows:
            row = await rows.fetchone()
        return msgspec.json.decode(row[0], type=ThreadView) if row else None

    async def threads(self, environment_id: str | None = None, after: str | None = None,
                      limit: int = -1) -> list[ThreadView]:
        """In id order, from the first id past `after` (see `environments`)."""
        query, args = "SELECT document FROM threads WHERE id > ?", [after or ""]
        if environment_id:
            query, args = query + " AND environment_id = ?", [*args, environment_id]
        async with self._db.execute(query + " ORDER BY id LIMIT ?", [*args, limit]) as rows:
            return [msgspec.json.decode(r[0], type=ThreadView) for r in await rows.fetchall()]

    async def transcript(self, environment_id: str, last: int = 50) -> list[str]:
        async with self._db.execute(
            "SELECT line FROM (SELECT sequence, line FROM transcript WHERE environment_id = ? "
            "ORDER BY sequence DESC LIMIT ?) ORDER BY sequence", (environment_id, last)
        ) as rows:
            return [r[0] for r in await rows.fetchall()]


def _render(line: d.TranscriptLine) -> str:
    return f"» {line.text}" if line.kind == "step" else line.text
