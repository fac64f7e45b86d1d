"""What `bb` prints for a person in 80 columns: the environment listing with realistic long values
(off a terminal too), `events tail`, `logs`, `show` and a wait's transcript lines wrapped on an
80-column terminal rather than run past it (whole in a pipe, for grep), and one time format for
`history`, `logs` and `tail`."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from bb_environments.entrypoints.cli import support, waiting
from bb_environments.entrypoints.cli.environment import _print_listing, _transcript_line
from bb_environments.entrypoints.cli.events import _tail_line
from bb_environments.entrypoints.cli.pool import _table as print_pools
from bb_environments.entrypoints.cli.support import clock

ENVIRONMENT = "3142f231-142f-4a87-9b66-0e0aaa28b153"
HOOK_LINE = "npm WARN deprecated " + " ".join(f"package-{n}@1.{n}.0" for n in range(12)) + " /a/" + "b" * 60


@pytest.fixture
def terminal_of_80_columns(monkeypatch):
    monkeypatch.setattr(support, "terminal_width", lambda stream: 80)


def test_the_listing_fits_80_columns_with_long_values_and_shows_the_disk(capsys):
    environments = [
        {
            "id": ENVIRONMENT,
            "status": "provisioning",
            "slug": "a-rather-long-project-name-t-0123456789",
            "threadIds": ["t-0123456789abcdef", "t-2", "t-3"],
            "diskBytes": 1288490189,
        },
        {"id": ENVIRONMENT.replace("3", "4"), "status": "ready", "slug": "short", "threadIds": ["t1"]},
    ]

    _print_listing({"environments": environments})

    header, first, second = capsys.readouterr().out.splitlines()
    assert max(map(len, (header, first, second))) <= 80
    assert header.split() == ["ID", "STATUS", "SLUG", "THREADS", "DISK"]
    assert first.startswith(f"{ENVIRONMENT}  provisioning  ") and first.endswith("  1.2G")
    assert second.split() == [ENVIRONMENT.replace("3", "4"), "ready", "short", "t1", "-"]  # not yet measured


def test_the_pools_fit_80_columns_with_a_long_project_and_a_pause(capsys, terminal_of_80_columns):
    paused = {
        "id": ENVIRONMENT,
        "hostId": "build-host-with-a-long-name",
        "projectPath": "/home/someone/src/github.com/an-organisation/a-rather-long-repository-name",
        "providerId": "git-worktree",
        "size": 3,
        "members": {"ready": 0, "preparing": 0, "stale": 1},
        "baseCommit": "b6e65fc22e28b6e65fc22e28b6e65fc22e28abcd",
        "paused": {"reason": "3 member setups failed in a row: .bb-env-setup.sh exited 1", "at": "..."},
    }
    filling = {
        **paused,
        "id": ENVIRONMENT.replace("3", "4"),
        "paused": None,
        "members": {"ready": 1, "preparing": 2, "stale": 0},
    }

    print_pools([paused, filling])

    header, first, second, *why = capsys.readouterr().out.splitlines()
    assert max(map(len, (header, first, second, *why))) <= 80
    assert header.split() == ["ID", "PROJECT", "READY", "BASE", "STATE"]
    assert first.startswith(ENVIRONMENT) and first.endswith("0/3    b6e65fc  paused")
    assert " ".join(why).split() == f"pool {ENVIRONMENT} paused: {paused['paused']['reason']}".split()
    assert second.startswith(ENVIRONMENT.replace("3", "4")) and second.endswith("1/3    b6e65fc  2 preparing")


def test_one_time_format_local_to_the_millisecond_with_the_date_when_not_today():
    now = datetime.now().astimezone()
    assert clock(now.isoformat()) == now.strftime("%H:%M:%S.%f")[:-3]
    earlier = now - timedelta(days=3)
    assert clock(earlier.isoformat()) == earlier.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    assert clock("2026-11-30T12:00:00.123456Z", today=datetime.fromisoformat("2026-11-30T12:00:00Z")).endswith(
        datetime.fromisoformat("2026-11-30T12:00:00.123Z").astimezone().strftime("%H:%M:%S.123")
    )


def test_tail_lines_fit_80_columns_and_say_the_event_and_a_changed_status(terminal_of_80_columns):
    now = datetime.now().astimezone().isoformat()
    statuses: dict[str, str] = {}
    created = _tail_line(
        f"bb.environments.{ENVIRONMENT}.created", {"occurredAt": now, "status": "provisioning"}, statuses
    )
    succeeded = _tail_line(
        f"bb.environments.{ENVIRONMENT}.setup_succeeded", {"occurredAt": now, "status": "provisioning"}, statuses
    )
    ready = _tail_line(f"bb.environments.{ENVIRONMENT}.ready", {"occurredAt": now, "status": "ready"}, statuses)
    said = _tail_line(
        f"bb.transcripts.{ENVIRONMENT}", {"occurredAt": now, "kind": "output", "text": HOOK_LINE}, statuses
    )

    assert created == f"{clock(now)}  {ENVIRONMENT}  created → provisioning"
    assert succeeded == f"{clock(now)}  {ENVIRONMENT}  setup_succeeded"  # still provisioning
    assert ready == f"{clock(now)}  {ENVIRONMENT}  ready"  # the event names the status
    lines = said.splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= 80
    assert " ".join(line.strip() for line in lines).endswith(HOOK_LINE.split()[-1][-20:])
    assert lines[0].startswith(f"{clock(now)}  {ENVIRONMENT}  npm WARN")


def test_transcript_lines_of_logs_show_and_a_wait_wrap_within_80_columns(terminal_of_80_columns, capsys):
    now = datetime.now().astimezone().isoformat()
    logged = _transcript_line(json.dumps({"occurredAt": now, "kind": "output", "text": HOOK_LINE}).encode())
    waiting._print_line(json.dumps({"occurredAt": now, "kind": "step", "text": HOOK_LINE}).encode())
    waited = capsys.readouterr().err

    for printed in (logged, waited):
        lines = printed.splitlines()
        assert len(lines) > 1 and max(map(len, lines)) <= 80, printed
        assert "".join(line.strip() for line in lines).replace(" ", "").endswith("b" * 60)
    assert logged.startswith(clock(now) + "    npm WARN") and waited.startswith("» npm WARN")


def test_off_a_terminal_a_transcript_line_stays_whole_for_grep():
    now = datetime.now().astimezone().isoformat()
    logged = _transcript_line(json.dumps({"occurredAt": now, "kind": "output", "text": HOOK_LINE}).encode())
    assert logged == f"{clock(now)}    {HOOK_LINE}"
