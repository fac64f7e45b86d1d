"""The read models' tables, and the rows an aggregate's public view makes in them: shared by the
live read model (projections/read_model.py) and a rebuild's scratch file (projections/rebuild_scratch.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import aiosqlite
import msgspec

from bb_environments.domain.status import EnvironmentStatus
from bb_environments.projections.views import EnvironmentView, ThreadView

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

REMOVED_AT = "json_extract(CAST(document AS TEXT), '$.updatedAt')"
IS_REMOVED = f"status = '{EnvironmentStatus.REMOVED.value}'"
LIVE_INDEXES = f"""
CREATE INDEX IF NOT EXISTS removed_environments_by_time ON environments ({REMOVED_AT}) WHERE {IS_REMOVED};
"""
"""Indexes of the live tables only: a rebuild's scratch file is read once, by the swap."""

LOG = "log"
TRANSCRIPT = "transcript"
LOG_FOLLOWED = "log-followed"
"""How far a replica's own follower of the log got with everything it does with a batch (the read
model is only its first step): where its ordered consumer starts again (SPEC 7.2)."""

View = EnvironmentView | ThreadView | None
"""An aggregate's public view just after a notification (None: the read model keeps nothing of it)."""


def latest_rows(views: Iterable[View]) -> tuple[list[tuple[str, str, str, bytes]], list[tuple[str, str | None, bytes]]]:
    """The rows of the environments and threads tables for each aggregate's last view of `views`
    only. INSERT OR REPLACE gives a replaced row a new rowid, so the rows end in the order (by
    rowid) that writing every view would leave."""
    latest: dict[tuple[type, str], EnvironmentView | ThreadView] = {}
    for view in views:
        if view is not None:
            key = (type(view), view.id)
            latest.pop(key, None)
            latest[key] = view
    environments = [
        (view.id, view.status, view.provider_id, msgspec.json.encode(view))
        for view in latest.values()
        if isinstance(view, EnvironmentView)
    ]
    threads = [
        (view.id, view.environment_id, msgspec.json.encode(view))
        for view in latest.values()
        if isinstance(view, ThreadView)
    ]
    return environments, threads


INSERT_ENVIRONMENTS = "INSERT OR REPLACE INTO environments VALUES (?, ?, ?, ?)"
INSERT_THREADS = "INSERT OR REPLACE INTO threads VALUES (?, ?, ?)"


async def write_views(db: aiosqlite.Connection, views: Iterable[View]) -> None:
    environments, threads = latest_rows(views)
    if environments:
        await db.executemany(INSERT_ENVIRONMENTS, environments)
    if threads:
        await db.executemany(INSERT_THREADS, threads)
