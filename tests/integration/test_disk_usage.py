"""Each live workspace's size on disk, through a real `bb serve` (SPEC 11): measured after setup and
again every BB_DISK_SCAN_INTERVAL_S as `du -sb` counts it, shown by `show` and `list`, and a
project's budget refusing spawns past it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bb_environments.domain.disk import human_bytes
from tests.integration.conftest import Service, service, write_hooks  # noqa: F401  (the fixture)
from tests.integration.host_agents import Agent, register

SCANNED_EVERY_SECOND = {"BB_DISK_SCAN_INTERVAL_S": "1"}
SCANNED_EVERY_HOUR = {"BB_DISK_SCAN_INTERVAL_S": "3600"}


def du_sb(path: str) -> int:
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True).stdout.split()[0])


def near(measured: int, path: str) -> bool:
    """Within 10% of what `du -sb` finds there now."""
    return abs(measured - du_sb(path)) <= du_sb(path) * 0.10


async def worktree(service: Service, repo: Path, thread_id: str):
    return await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(repo),
        "--thread-id",
        thread_id,
        "--json",
    )


@pytest.mark.parametrize("service", [SCANNED_EVERY_SECOND], indirect=True)
async def test_a_workspace_is_measured_after_setup_and_a_file_written_later_shows_at_the_next_scan(
    service, git_repo, tmp_path
):
    # The setup writes 300 kB: what it leaves counts, as everything in the workspace does.
    write_hooks(git_repo, tmp_path / "hooks.log", setup="head -c 300000 /dev/zero > setup-output.bin")
    spawned = await worktree(service, git_repo, "t1")
    assert spawned.returncode == 0, spawned.stderr
    environment_id = spawned.json()["environmentId"]

    measured = await service.wait_for(environment_id, lambda e: e["status"] == "ready" and e["diskBytes"])
    path = measured["path"]
    assert near(measured["diskBytes"], path), (measured["diskBytes"], du_sb(path))
    assert measured["diskBytes"] > 300_000

    (Path(path) / "node_modules").mkdir()
    (Path(path) / "node_modules" / "big.bin").write_bytes(b"x" * 3_000_000)
    grown = await service.wait_for(environment_id, lambda e: e["diskBytes"] > 3_000_000, timeout=30)
    assert near(grown["diskBytes"], path), (grown["diskBytes"], du_sb(path))

    listed = (await service.bb("environment", "list", "--json")).json()["environments"]
    assert [e["diskBytes"] for e in listed] == [grown["diskBytes"]]
    table = await service.bb("environment", "list")
    header, row = table.stdout.splitlines()
    assert "DISK" in header.split() and human_bytes(grown["diskBytes"]) in row.split()
    assert max(len(line) for line in table.stdout.splitlines()) <= 80


@pytest.mark.parametrize("service", [SCANNED_EVERY_HOUR], indirect=True)
async def test_new_workspaces_are_measured_soon_after_their_setup_not_at_the_next_scan(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "hooks.log", setup="head -c 300000 /dev/zero > setup-output.bin")
    spawns = [await worktree(service, git_repo, f"t{n}") for n in range(3)]
    assert all(s.returncode == 0 for s in spawns), [s.stderr for s in spawns]
    personal = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--json")
    assert personal.returncode == 0, personal.stderr

    measured = [
        await service.wait_for(spawn.json()["environmentId"], lambda e: e["diskBytes"], timeout=30)
        for spawn in (*spawns, personal)
    ]
    for environment in measured:
        assert environment["status"] == "ready"
        assert near(environment["diskBytes"], environment["path"]), (environment["diskBytes"], environment["path"])
    *worktrees, empty = (environment["diskBytes"] for environment in measured)
    assert empty < 300_000 <= min(worktrees)  # made empty, against what the worktrees' setup wrote


@pytest.mark.parametrize(
    "service", [{**SCANNED_EVERY_SECOND, "BB_MAX_DISK_BYTES_PER_PROJECT": "200000"}], indirect=True
)
async def test_a_spawn_in_a_project_past_its_disk_budget_is_refused_naming_budget_and_usage(
    service, git_repo, tmp_path
):
    write_hooks(git_repo, tmp_path / "hooks.log", setup="head -c 300000 /dev/zero > setup-output.bin")
    first = await worktree(service, git_repo, "t1")
    assert first.returncode == 0, first.stderr
    measured = await service.wait_for(first.json()["environmentId"], lambda e: e["diskBytes"])
    worktrees = sorted(Path(measured["path"]).parent.parent.iterdir())

    refused = await worktree(service, git_repo, "t2")

    assert refused.returncode == 1, refused.stderr
    message = refused.json()["error"]["message"]
    assert "BB_MAX_DISK_BYTES_PER_PROJECT (200000 bytes" in message, message
    assert f"take {measured['diskBytes']} bytes" in message and str(git_repo) in message
    listed = (await service.bb("environment", "list", "--json")).json()["environments"]
    assert [e["id"] for e in listed] == [measured["id"]]
    threads = (await service.bb("thread", "list", "--json")).json()["threads"]
    assert [t["id"] for t in threads] == ["t1"]  # a refused spawn leaves no thread behind
    assert sorted(Path(measured["path"]).parent.parent.iterdir()) == worktrees  # and no workspace

    # A thread event's request is refused the same way, as its placement outcome.
    nc = await service.connect("publisher")
    try:
        outcomes = await nc.subscribe("bb.placements.t3.*")
        js = nc.jetstream()
        created = {
            "type": "created",
            "threadId": "t3",
            "occurredAt": "2026-01-01T00:00:00Z",
            "projectPath": str(git_repo),
            "environment": {
                "type": "provider",
                "environmentProviderId": "git-worktree",
                "machine": {"type": "existing", "hostId": "local"},
                "inputs": {},
            },
        }
        await js.publish("bb.threads.t3.created", json.dumps(created).encode())
        await js.publish(
            "bb.threads.t3.message",
            json.dumps({"type": "message", "threadId": "t3", "occurredAt": "2026-01-01T00:00:01Z"}).encode(),
        )
        outcome = await outcomes.next_msg(timeout=30)
    finally:
        await nc.close()
    assert outcome.subject == "bb.placements.t3.refused"
    assert "BB_MAX_DISK_BYTES_PER_PROJECT" in json.loads(outcome.data)["reason"]

    removed = await service.bb("thread", "archive", "t1", "--wait", "--json")
    assert removed.returncode == 0, removed.stderr
    assert (await worktree(service, git_repo, "t4")).returncode == 0  # the removal made room


@pytest.mark.parametrize("service", [SCANNED_EVERY_SECOND], indirect=True)
async def test_the_agent_of_a_workspaces_host_measures_it(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "hooks.log", setup="head -c 200000 /dev/zero > setup-output.bin")
    agent = Agent(service, "h1", Path((await register(service, "h1"))["credentials"]), tmp_path / "h1")
    agent.start()
    try:
        environment_id = await service.spawn("git-worktree", project=git_repo, host="h1")
        measured = await service.wait_for(environment_id, lambda e: e["diskBytes"], timeout=60)
        assert measured["path"].startswith(str(agent.root) + "/")
        assert near(measured["diskBytes"], measured["path"]), (measured["diskBytes"], du_sb(measured["path"]))
    finally:
        agent.stop()
    assert "Traceback" not in agent.log() + service.log_tail()
