"""The console's pictures as the operator reads them: an environment's timeline drawn to scale with
its hook runs as bars, and whatever the service says shown as text, never run as HTML."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from bb_environments.entrypoints.console.feeds import FleetFeed
from bb_environments.entrypoints.console.views import environment_parts, fleet_parts, timeline

START = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


def history(*steps: tuple[str, int]) -> list[dict]:
    """Events, each with the milliseconds to the next (the last: None)."""
    events, at = [], START
    for version, (kind, took) in enumerate(steps, 1):
        last = version == len(steps)
        events.append(
            {"version": version, "type": kind, "occurredAt": at.isoformat(), "durationMs": None if last else took}
        )
        at += timedelta(milliseconds=took)
    return events


def bars(html: str, kind: str) -> list[tuple[float, float]]:
    """(left, width) in percent of each bar of `kind`, in order."""
    return [
        (float(left), float(width))
        for left, width in re.findall(rf'class="bar {kind}" style="left:([\d.]+)%;width:([\d.]+)%"', html)
    ]


def test_each_event_is_as_long_as_the_time_to_the_next_on_one_scale():
    drawn = timeline(history(("claimed", 1000), ("created", 0), ("setup_started", 3000), ("ready", 0)), now=None)
    assert bars(drawn, "event") == [(0.0, 25.0), (25.0, 0.0), (25.0, 75.0), (100.0, 0.0)]
    assert "1.0 s" in drawn and "3.0 s" in drawn


def test_a_hook_run_is_a_bar_from_its_start_to_its_end_and_runs_on_to_now_while_it_runs():
    finished = timeline(
        history(("claimed", 1000), ("setup_started", 2000), ("setup_failed", 1000), ("attempt_cleaned", 0)), now=None
    )
    assert bars(finished, "hook failed") == [(25.0, 50.0)]
    running = timeline(history(("claimed", 1000), ("setup_started", 0)), now=START + timedelta(seconds=4))
    assert bars(running, "hook running") == [(25.0, 75.0)]
    assert "3.0 s so far" in running


def test_what_the_service_says_is_text_on_the_page():
    hostile = "<script>alert(1)</script>"
    environment = {
        "id": "e1",
        "status": "error",
        "statusMessage": hostile,
        "providerId": "git-worktree",
        "hostId": "local",
        "projectPath": f"/tmp/{hostile}",
        "path": None,
        "pathKey": "k",
        "threadIds": [hostile],
        "hooks": {"setup": {"status": "failed"}, "teardown": {}},
        "createdAt": START.isoformat(),
    }
    shown = environment_parts(environment, history(("claimed", 0)), START)
    listed = fleet_parts([environment], [], None, None, START)
    for html in [*shown.values(), *listed.values()]:
        assert "<script>" not in html
    assert "&lt;script&gt;" in shown["headline"] and "&lt;script&gt;" in listed["environments"]


def test_a_size_not_measured_yet_and_sections_the_service_lacks_show_nothing_made_up():
    environment = {
        "id": "e1", "status": "ready", "providerId": "p", "hostId": "local", "projectPath": None,
        "threadIds": [], "createdAt": START.isoformat(),
    }  # fmt: skip
    listed = fleet_parts([environment], [], None, None, START)
    assert '<td data-label="Disk"><div>-</div></td>' in listed["environments"]
    assert listed["pools"] == "" and listed["replicas"] == ""
    measured = fleet_parts([{**environment, "diskBytes": 3 * 1024 * 1024}], [], [], [], START)
    assert "3.0 MiB" in measured["environments"] and "No pools." in measured["pools"]


async def test_a_replica_that_ended_stays_listed_offline_with_when_it_was_last_seen():
    feed = FleetFeed(None)  # type: ignore[arg-type]  # only what it remembers is asked
    presence = {"replicaId": "r1", "pid": 7, "machine": "m", "dataDir": "/d", "store": "postgresql"}
    seen = feed._seen([{**presence, "startedAt": START.isoformat()}], START)
    assert [(r["replicaId"], r["status"]) for r in seen] == [("r1", "online")]
    later = START + timedelta(minutes=5)
    gone = feed._seen([], later)
    assert [(r["replicaId"], r["status"], r["lastSeenAt"]) for r in gone] == [("r1", "offline", START.isoformat())]
    listed = fleet_parts([], [], gone, None, later)["replicas"]
    assert "offline" in listed and "5 min 0 s ago" in listed
