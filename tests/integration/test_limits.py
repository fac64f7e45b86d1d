"""What one publisher may ask for, through a real `bb serve` (SPEC 9): how many environments live at
once, and which projects."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Service, service_environment


async def personal(service: Service, thread_id: str):
    return await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", thread_id, "--json"
    )


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


@pytest.mark.parametrize("service", [{"BB_MAX_LIVE_ENVIRONMENTS": "3"}], indirect=True)
async def test_a_spawn_past_the_hosts_limit_is_refused_naming_it_and_a_removal_frees_a_place(service):
    for number in range(3):
        assert (await personal(service, f"t{number}")).returncode == 0

    refused = await personal(service, "t3")

    assert refused.returncode == 1, refused.stderr
    message = refused.json()["error"]["message"]
    assert "BB_MAX_LIVE_ENVIRONMENTS (3)" in message and "host local has 3 live environments" in message
    listed = (await service.bb("environment", "list", "--json")).json()["environments"]
    assert len(listed) == 3

    first = await service.bb("thread", "archive", "t0", "--wait", "--json")
    assert first.returncode == 0, first.stderr
    assert (await personal(service, "t3")).returncode == 0


@pytest.mark.parametrize("service", [{"BB_MAX_LIVE_ENVIRONMENTS_PER_PROJECT": "3"}], indirect=True)
async def test_a_thread_event_past_a_projects_limit_is_refused_as_its_placement_outcome(service, git_repo, tmp_path):
    for number in range(3):
        assert (await worktree(service, git_repo, f"t{number}")).returncode == 0
    other = tmp_path / "other"
    # A clone, not a copy: the service may still be adding the worktrees above, whose lock files
    # come and go under a copy.
    subprocess.run(["git", "clone", "--quiet", str(git_repo), str(other)], check=True)
    assert (await worktree(service, other, "elsewhere")).returncode == 0  # another project has its own count

    nc = await service.connect("publisher")
    try:
        js = nc.jetstream()
        outcomes = await nc.subscribe("bb.placements.t3.*")
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
    reason = json.loads(outcome.data)["reason"]
    assert "BB_MAX_LIVE_ENVIRONMENTS_PER_PROJECT (3)" in reason and str(git_repo) in reason


@pytest.mark.parametrize("service", [{"BB_PROJECT_ROOTS": "/nonexistent/projects:/srv/repos"}], indirect=True)
async def test_a_project_outside_the_project_roots_is_refused_naming_them(service, git_repo):
    refused = await worktree(service, git_repo, "t1")

    assert refused.returncode == 2, refused.stderr
    message = refused.json()["error"]["message"]
    assert "outside BB_PROJECT_ROOTS" in message and "/nonexistent/projects, /srv/repos" in message
    assert (await service.bb("environment", "list", "--json")).json()["environments"] == []
    assert (await service.bb("thread", "spawn", "--environment-provider", "personal-workspace")).returncode == 0


async def test_a_project_inside_the_project_roots_is_placed(tmp_path, git_repo):
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_PROJECT_ROOTS=str(tmp_path)))
    await service.start()
    try:
        spawned = await worktree(service, git_repo, "t1")
        assert spawned.returncode == 0, spawned.stderr
    finally:
        await service.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a repository another user owns needs root")
async def test_a_repository_another_user_owns_is_refused_for_that_reason(service, git_repo, tmp_path):
    foreign = tmp_path / "foreign"
    shutil.copytree(git_repo, foreign)
    subprocess.run(["chown", "-R", "65534:65534", str(foreign)], check=True)
    # git in the test's own environment would refuse it the same way: the service's git is not special.
    assert (
        "dubious ownership"
        in subprocess.run(["git", "-C", str(foreign), "status"], capture_output=True, text=True).stderr
    )

    refused = await worktree(service, foreign, "t1")

    assert refused.returncode == 2, refused.stderr
    message = refused.json()["error"]["message"]
    assert "another user owns" in message and "dubious ownership" in message
    assert "not a git repository" not in message
