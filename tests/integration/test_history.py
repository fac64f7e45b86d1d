"""`bb environment history` and `show --at` against a real `bb serve`: a lifecycle's past, version
by version, is what `show` printed while it happened."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from bb_environments.bus.wire.api_messages import ListHistory
from tests.integration.conftest import Service, environment_events, spawn_with_setup_held

LONG_GRACE = {"BB_RETIRE_GRACE_MS": "600000"}
"""An archived environment waits in `retiring`, where its document can be shown, until deleted."""


async def bb_json(service: Service, *args: str) -> Any:
    result = await service.bb(*args, "--json")
    assert result.returncode == 0, result.stderr
    return result.json()


async def shown_when(service: Service, environment_id: str, condition: Any) -> dict[str, Any]:
    """What `show --json` prints once the read model satisfies `condition`, which holds from then on."""
    await service.wait_for(environment_id, condition)
    return await bb_json(service, "environment", "show", environment_id)


def without_transcript(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "transcript"}


async def lifecycle(service: Service, repo, tmp_path) -> tuple[str, list[dict[str, Any]]]:
    """spawn -> setup running -> ready -> retiring -> removed of a git worktree with a setup script;
    the environment, and what `show --json` printed at each of those steps."""
    hold = tmp_path / "hold"
    environment_id = await spawn_with_setup_held(service, repo, hold, tmp_path / "hooks.log")
    printed = [await shown_when(service, environment_id, lambda e: e["hooks"]["setup"]["status"] == "running")]
    hold.unlink()
    printed.append(await shown_when(service, environment_id, "ready"))
    assert (await service.bb("thread", "archive", "t1")).returncode == 0
    printed.append(await shown_when(service, environment_id, "retiring"))
    assert (await service.bb("environment", "delete", environment_id)).returncode == 0
    printed.append(await shown_when(service, environment_id, "removed"))
    return environment_id, printed


@pytest.mark.parametrize("service", [LONG_GRACE], indirect=True)
async def test_every_version_of_a_lifecycle_is_shown_as_it_was(service, git_repo, tmp_path):
    environment_id, printed = await lifecycle(service, git_repo, tmp_path)
    published = await environment_events(service, environment_id)

    history = await bb_json(service, "environment", "history", environment_id)

    assert history["environmentId"] == environment_id
    assert [(e["version"], e["type"], e["occurredAt"]) for e in history["events"]] == [
        (e["version"], e["type"], e["occurredAt"]) for e in published
    ]
    assert published[-1]["type"] == "removed" and printed[-1]["version"] == len(published)
    instants = [datetime.fromisoformat(e["occurredAt"]) for e in history["events"]]
    assert [e["durationMs"] for e in history["events"]] == [
        (later - earlier) // timedelta(milliseconds=1) for earlier, later in zip(instants, instants[1:])
    ] + [None]

    past = {
        e["version"]: await bb_json(service, "environment", "show", environment_id, "--at", str(e["version"]))
        for e in published
    }
    for event in published:  # what each event's document says of the environment after it
        then = past[event["version"]]
        assert (then["version"], then["updatedAt"], then["status"], then["statusMessage"], then["threadIds"]) == (
            event["version"],
            event["occurredAt"],
            event["status"],
            event["statusMessage"],
            event["threadIds"],
        )
        assert then["transcript"] == []  # the transcript is no part of the log
    assert [printed_then["status"] for printed_then in printed] == ["provisioning", "ready", "retiring", "removed"]
    for printed_then in printed:  # and field for field what `show` printed then
        assert without_transcript(past[printed_then["version"]]) == without_transcript(printed_then)


@pytest.mark.parametrize("service", [LONG_GRACE], indirect=True)
async def test_show_at_an_instant_is_the_last_version_recorded_by_then(service, git_repo, tmp_path):
    environment_id, printed = await lifecycle(service, git_repo, tmp_path)
    events = (await bb_json(service, "environment", "history", environment_id))["events"]

    for event in events:
        instant = datetime.fromisoformat(event["occurredAt"])
        latest_by_then = max(e["version"] for e in events if datetime.fromisoformat(e["occurredAt"]) <= instant)
        then = await bb_json(service, "environment", "show", environment_id, "--at", event["occurredAt"])
        assert then["version"] == latest_by_then
        if event["durationMs"]:  # just before the next event: still this version
            before_next = instant + timedelta(milliseconds=event["durationMs"]) - timedelta(microseconds=1)
            shown = await bb_json(service, "environment", "show", environment_id, "--at", before_next.isoformat())
            assert shown["version"] == event["version"]
    # Any timezone names the same instant.
    ready = next(e for e in events if e["type"] == "ready")
    elsewhere = datetime.fromisoformat(ready["occurredAt"]).astimezone(timezone(timedelta(hours=-5))).isoformat()
    assert (await bb_json(service, "environment", "show", environment_id, "--at", elsewhere))["version"] == ready[
        "version"
    ]
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    shown_later = await bb_json(service, "environment", "show", environment_id, "--at", later)
    assert without_transcript(shown_later) == without_transcript(printed[-1])


async def test_what_the_log_does_not_hold_is_refused_and_nothing_is_written(service, git_repo, tmp_path):
    hold = tmp_path / "hold"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, tmp_path / "hooks.log")
    hold.unlink()
    await service.wait_for(environment_id, "ready")
    await service.measured()
    events = (await bb_json(service, "environment", "history", environment_id))["events"]
    latest = events[-1]["version"]
    first = datetime.fromisoformat(events[0]["occurredAt"])
    exported = (await service.bb("events", "export")).stdout
    unknown = str(uuid.uuid4())

    refused = [
        (("show", environment_id, "--at", str(latest + 1)), 2, f"environment {environment_id} has versions 1-{latest}"),
        (
            ("show", environment_id, "--at", (first - timedelta(seconds=1)).isoformat()),
            2,
            f"environment {environment_id} was first recorded at",
        ),
        (("show", environment_id, "--at", "0"), 2, "is neither a version (1 or more) nor an ISO-8601 instant"),
        (("show", environment_id, "--at", "yesterday"), 2, "is neither a version (1 or more) nor an ISO-8601 instant"),
        (("show", environment_id, "--at", "2026-01-31T12:00:00"), 2, "an ISO-8601 instant with a timezone"),
        (("show", unknown, "--at", "1"), 3, f"no environment {unknown}"),
        (("show", unknown, "--at", first.isoformat()), 3, f"no environment {unknown}"),
        (("history", unknown), 3, f"no environment {unknown}"),
        (("history", "not-an-id"), 2, "is not a valid id"),
    ]
    for args, exit_code, message in refused:
        result = await service.bb("environment", *args, "--json")
        assert (result.returncode, result.json()["error"]["code"]) == (
            exit_code,
            {2: "invalid_input", 3: "not_found"}[exit_code],
        ), (args, result.stderr)
        assert message in result.stderr and message in result.json()["error"]["message"], (args, result.stderr)
    assert (await service.bb("events", "export")).stdout == exported


async def test_history_pages_through_the_api_and_prints_a_table_for_80_columns(service, git_repo, tmp_path):
    hold = tmp_path / "hold"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, tmp_path / "hooks.log")
    hold.unlink()
    await service.wait_for(environment_id, "ready")
    whole = (await bb_json(service, "environment", "history", environment_id))["events"]

    paged, after = [], 0
    while True:
        page = await service.api.call(
            "environments", "history", ListHistory(environment_id=environment_id, after=after, limit=2)
        )
        assert len(page["events"]) <= 2
        paged.extend(page["events"])
        if page.get("next") is None:
            break
        after = page["next"]
    assert paged == whole and len(whole) == 5

    table = await service.bb("environment", "history", environment_id)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["VERSION", "EVENT", "TIME", "DURATION"]
    assert [line.split()[:2] for line in lines[1:]] == [[str(e["version"]), e["type"]] for e in whole]
    # The local time to the millisecond, as `logs` and `events tail` print it.
    assert [line.split()[2] for line in lines[1:]] == [
        datetime.fromisoformat(e["occurredAt"]).astimezone().strftime("%H:%M:%S.%f")[:-3] for e in whole
    ]
    assert lines[-1].split()[-1] == "-"  # nothing follows the last event yet
    assert max(map(len, lines)) <= 80
