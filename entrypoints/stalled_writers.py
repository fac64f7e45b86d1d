"""Ending a writer of a shared PostgreSQL store that stalls while it holds the log's table lock.

eventsourcing's PostgreSQL recorder locks the events table for each save, so that notifications
commit in id order (handlers/log_indexes.py relies on it), and sends the lock, the inserts and
the sync in one pipeline. A replica frozen half way through that pipeline (SIGSTOP, a VM paused,
a GC pause, a partition after the lock went out) keeps the lock: PostgreSQL arms
`idle_in_transaction_session_timeout` only once a sync has been answered, and ends neither a
session waiting for the rest of a pipeline nor, before version 17, a transaction by its age.
Every other replica's saves then time out (`POSTGRES_LOCK_TIMEOUT`) for as long as the frozen
one is frozen: the whole deployment stops for one stalled process.

So each replica ends, every few seconds, any other session that has held the lock far longer than
a save takes. The stalled writer's transaction is rolled back: nothing it was saving is written,
and when it wakes its save fails on the closed connection and its command is run again, as after
any lost race (handlers/writers.py).
"""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

from eventsourcing.application import Application

log = logging.getLogger(__name__)

STALLED_AFTER_S = 10
"""A transaction holding the log's table lock this long is stalled: a save holds it for
milliseconds, and twice `POSTGRES_LOCK_TIMEOUT` (entrypoints/event_store.py) is beyond any wait."""
CHECK_EVERY_S = 2.0

_END_STALLED_HOLDERS = """
SELECT activity.pid, pg_terminate_backend(activity.pid)
FROM pg_locks AS lock JOIN pg_stat_activity AS activity ON activity.pid = lock.pid
WHERE lock.locktype = 'relation' AND lock.relation = %s::regclass AND lock.mode = 'ExclusiveLock'
  AND lock.granted AND activity.pid <> pg_backend_pid()
  AND activity.xact_start < now() - make_interval(secs => %s)
"""


def end_stalled_holders(app: Application[UUID]) -> list[int]:
    """End the sessions that have held the log's table lock for longer than STALLED_AFTER_S; the
    process ids of those ended."""
    from eventsourcing.postgres import PostgresApplicationRecorder  # only a PostgreSQL store asks

    recorder = app.recorder
    assert isinstance(recorder, PostgresApplicationRecorder)
    table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
    with recorder.datastore.get_connection() as connection, connection.cursor() as cursor:
        cursor.execute(_END_STALLED_HOLDERS, (table, STALLED_AFTER_S))
        return [row["pid"] for row in cursor.fetchall()]


async def end_stalled_holders_forever(app: Application[UUID]) -> None:
    """`end_stalled_holders` every CHECK_EVERY_S; a check that fails (the store away) is tried
    again at the next."""
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        try:
            ended = await asyncio.to_thread(end_stalled_holders, app)
        except Exception as error:
            log.debug("checking for a stalled writer of the store failed: %s", error)
            continue
        for pid in ended:
            log.warning(
                "ended the store session %s: it held the log's table lock for over %s s, stopping "
                "every save (a writer frozen half way through a save); its transaction is rolled back",
                pid,
                STALLED_AFTER_S,
            )
