"""`bb doctor [--fix]` against a real `bb serve` and real repositories: each kind of leftover and a
deleted workspace found, fixed, and not found again; a live environment's workspace never touched."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import Service, eventually, service_environment
from tests.integration.test_bus_access import connect_as
from tests.integration.test_crash_recovery import died, restart

# Live environments stay live (no retirement), and the sweep looks for leftovers at every round.
SETTINGS = {"BB_RETIRE_GRACE_MS": "600000", "BB_DOCTOR_INTERVAL_S": "1"}


async def spawn(service: Service, *args: str) -> dict:
    result = await service.bb("thread", "spawn", "--wait", "--json", *args)
    assert result.returncode == 0, result.stderr
    return await service.wait_for(result.json()["environmentId"], "ready")


def commit(git, repo: Path, message: str) -> None:
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", message)


@pytest.mark.parametrize("service", [SETTINGS], indirect=True)
async def test_doctor_finds_each_leftover_and_a_deleted_workspace_fixes_them_and_then_finds_nothing(
    service, git_repo, git, tmp_path
):
    repo = os.path.realpath(git_repo)
    live = await spawn(service, "--environment-provider", "git-worktree", "--project", repo, "--thread-id", "live")
    (Path(live["path"]) / "work.txt").write_text("the live thread's work\n")
    personal = await spawn(service, "--environment-provider", "personal-workspace", "--thread-id", "mine")
    gone = await spawn(service, "--environment-provider", "git-worktree", "--project", repo, "--thread-id", "gone")
    assert (await service.bb("doctor")).stdout.strip() == "nothing found"

    providers = service.data_dir / "providers"
    stray = providers / "git-worktree" / "worktrees" / "crashed" / "repo"
    stray.parent.mkdir(parents=True)
    git(repo, "worktree", "add", "-q", "-b", "bb/crashed", str(stray), "main")
    (stray / "unsaved.txt").write_text("work nobody committed\n")
    git(repo, "branch", "bb/lonely", "main")
    lonely_worktree = tmp_path / "lonely"
    git(repo, "worktree", "add", "-q", str(lonely_worktree), "bb/lonely")
    commit(git, lonely_worktree, "a commit on no other branch")
    lonely_tip = git(lonely_worktree, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", str(lonely_worktree))
    nobody = providers / "personal-workspace" / "workspaces" / "nobody"
    nobody.mkdir(parents=True)
    shutil.rmtree(gone["path"])

    found = await service.bb("doctor", "--json")
    assert found.returncode == 1, found.stderr
    report = found.json()
    assert set(report) == {"orphans", "missing"}
    assert sorted((o["kind"], o["path"]) for o in report["orphans"]) == sorted(
        [
            ("worktree", os.path.realpath(stray)),
            ("branch", f"{repo}:bb/crashed"),
            ("branch", f"{repo}:bb/lonely"),
            ("workspace", os.path.realpath(nobody)),
        ]
    )
    assert all(set(o) == {"hostId", "path", "kind"} and o["hostId"] == "local" for o in report["orphans"])
    assert report["missing"] == [{"environmentId": gone["id"], "hostId": "local", "path": gone["path"]}]
    human = await service.bb("doctor")
    assert human.returncode == 1 and "orphans:" in human.stdout and gone["id"] in human.stdout
    await eventually(
        lambda: "bb doctor would find 4 orphans and 1 missing workspaces" in service.log_tail(),
        "the sweep reported what doctor finds",
    )
    assert stray.is_dir() and nobody.is_dir()  # the sweep only reports

    fixed = await service.bb("doctor", "--fix")
    assert fixed.returncode == 0, fixed.stderr
    saved = git(repo, "for-each-ref", "--format=%(refname)", "refs/bb/saved/").splitlines()
    assert len(saved) == 2 and all(ref.startswith("refs/bb/saved/orphan-") for ref in saved)
    assert all(ref in fixed.stdout for ref in saved)
    worktree_save = next(ref for ref in saved if git(repo, "rev-parse", ref) != lonely_tip)
    assert git(repo, "show", f"{worktree_save}:unsaved.txt") == "work nobody committed"
    assert not stray.exists() and not nobody.exists()
    left = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/bb/").splitlines()
    assert len(left) == 2 and "bb/crashed" not in left and "bb/lonely" not in left  # the live environments'

    errored = await service.wait_for(gone["id"], "error")
    assert "vanished" in errored["statusMessage"]
    again = await service.bb("doctor", "--json")
    assert again.returncode == 0, again.stderr
    assert again.json() == {"orphans": [], "missing": []}
    assert (await service.bb("doctor")).stdout.strip() == "nothing found"

    # What live environments record was never touched, and the vanished one comes back on retry.
    assert (Path(live["path"]) / "work.txt").read_text() == "the live thread's work\n"
    assert Path(personal["path"]).is_dir()
    assert (await service.show(live["id"]))["status"] == "ready"
    assert (await service.bb("environment", "retry", gone["id"])).returncode == 0
    back = await service.wait_for(gone["id"], "ready")
    assert Path(back["path"]).is_dir()
    assert (await service.bb("doctor", "--json")).json() == {"orphans": [], "missing": []}


@pytest.mark.parametrize("role", ["publisher", "subscriber"])
async def test_only_an_operator_may_ask_the_doctor(service, role):
    nc, violations = await connect_as(service, role)
    try:
        await nc.publish("bb.api.doctor.run", b'{"fix": true}')
        await violations.wait_for('publish to "bb.api.doctor.run"')
    finally:
        await nc.close()


async def test_a_fix_killed_just_after_saving_an_orphans_work_is_finished_by_the_next_one(tmp_path, git_repo, git):
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_CRASH_AT="work-saved"))
    await service.start()
    try:
        stray = service.data_dir / "providers" / "git-worktree" / "worktrees" / "crashed" / "repo"
        stray.parent.mkdir(parents=True)
        git(git_repo, "worktree", "add", "-q", "-b", "bb/crashed", str(stray), "main")
        (stray / "unsaved.txt").write_text("work nobody committed\n")

        cut_short = await service.bb("doctor", "--fix")
        assert cut_short.returncode != 0
        await died(service)
        first_save = git(git_repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/bb/saved/")
        assert first_save.startswith("refs/bb/saved/orphan-") and stray.is_dir()  # saved, not yet removed

        await restart(service)
        finished = await service.bb("doctor", "--fix")
        assert finished.returncode == 0, finished.stderr
        assert git(git_repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/bb/saved/") == first_save
        assert not stray.exists()
        assert (await service.bb("doctor", "--json")).json() == {"orphans": [], "missing": []}
    finally:
        await service.stop()


@pytest.mark.parametrize("service", [SETTINGS], indirect=True)
async def test_the_branch_a_removal_kept_is_no_orphan_but_a_stray_one_still_is(service, git_repo, git):
    repo = os.path.realpath(git_repo)
    kept = await spawn(service, "--environment-provider", "git-worktree", "--project", repo, "--thread-id", "kept")
    commit(git, Path(kept["path"]), "the thread's own work")
    assert (await service.bb("thread", "archive", "kept")).returncode == 0
    deleted = await service.bb("environment", "delete", kept["id"], "--wait")
    assert deleted.returncode == 0, deleted.stderr
    assert git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/bb/").splitlines() != []

    clean = await service.bb("doctor", "--json")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.json() == {"orphans": [], "missing": []}

    git(repo, "branch", "bb/kept-9", "main")  # a branch of bb's layout that no removal kept
    stray = await service.bb("doctor", "--json")
    assert stray.returncode == 1
    assert [(o["kind"], o["path"]) for o in stray.json()["orphans"]] == [("branch", f"{repo}:bb/kept-9")]
