"""A log written before the code became the `bb_environments` package still loads and drives on.

The fixture is a real event store written by `bb serve` of the earlier layout (two personal
workspaces, one archived through to removed) and its `bb events export` from that time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.handlers.application import Environments

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_events_stored_under_the_old_module_names_load_and_publish_as_they_did(tmp_path):
    store = tmp_path / "events.sqlite"
    shutil.copy(FIXTURES / "events-before-package-rename.sqlite", store)
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(store)})

    published = [logged.payload() for logged in LogReader(app).page(0, limit=1000)]

    exported = (FIXTURES / "events-before-package-rename.jsonl").read_bytes().splitlines()
    assert [msgspec.json.decode(p) for p in published] == [msgspec.json.decode(line) for line in exported]
    unfinished = app.unfinished_environment_ids()
    assert len(unfinished) == 1
    assert app.environment(unfinished[0]).status == EnvironmentStatus.READY
    # The indexes read the log by topic: the old names count, so the ready workspace's claim is held.
    held = [holder for _, path, holder in app.claims.live() if path.endswith("/old-b")]
    assert held == [unfinished[0]]


def test_an_environment_removed_before_work_was_saved_reads_as_having_saved_nothing(tmp_path):
    store = tmp_path / "events.sqlite"
    shutil.copy(FIXTURES / "events-before-package-rename.sqlite", store)
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(store)})

    removed = [
        logged.view
        for logged in LogReader(app).page(0, limit=1000)
        if logged.view is not None and getattr(logged.view, "status", None) == EnvironmentStatus.REMOVED
    ]

    assert removed and all(view.saved_ref is None for view in removed)
