"""`bb doctor`'s comparison of the log with a host, the fact a vanished workspace leaves, and a
host's leftovers in real repositories (no NATS)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from datetime import UTC, datetime

import pytest

from bb_environments.domain.status import EnvironmentStatus
from bb_environments.handlers.application import Environments
from bb_environments.handlers.doctor import compare, protected_by
from bb_environments.providers.contract import Leftover, Removed, RemoveFailed
from bb_environments.providers.git_worktree import GitWorktreeProvider
from bb_environments.providers.personal_workspace import PersonalWorkspaceProvider
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspace_messages import LeftoverRemoval, Survey, SurveyRequest
from bb_environments.providers.workspaces import LocalWorkspaces
from tests.unit.test_local_workspaces import Lines

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ROOT = "/data/providers/git-worktree/worktrees"


@pytest.fixture
def app():
    application = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 0)
    yield application
    application.close()


def ready(app, thread_id, path_key, path, provider="git-worktree", project="/repo", resource=None):
    app.register_thread(thread_id, project, None, "local", None)
    env = app.claim_environment(thread_id, provider, "local", project, {}, path_key, path)
    created = app.record_created(env.id, 1, path, True, "main", resource)
    return app.record_setup_outcome(env.id, created.setup_operation_id, True, None)


def test_what_no_live_environment_records_is_an_orphan_and_a_gone_workspace_is_missing(app):
    live = ready(app, "t1", "t1", f"{ROOT}/t1/repo", resource={"branch": "bb/t1"})
    gone = ready(app, "t2", "t2", f"{ROOT}/t2/repo", resource={"branch": "bb/t2"})
    removed = ready(app, "t3", "t3", f"{ROOT}/t3/repo", resource={"branch": "bb/t3"})
    app.archive_thread("t3", NOW)
    app.start_removal(removed.id, NOW)
    app.skip_teardown(removed.id, "none")
    app.record_removed(removed.id, 1)
    found = [
        Leftover("git-worktree", "worktree", f"{ROOT}/t1/repo", repo="/repo", path_key="t1"),
        Leftover("git-worktree", "worktree", f"{ROOT}/t3/repo", repo="/repo", path_key="t3"),
        Leftover("git-worktree", "workspace", f"{ROOT}/stray/repo", path_key="stray"),
        Leftover("git-worktree", "branch", "/repo:bb/t1", repo="/repo", branch="bb/t1"),
        Leftover("git-worktree", "branch", "/repo:bb/t2", repo="/repo", branch="bb/t2"),
        Leftover("git-worktree", "branch", "/repo:bb/t3", repo="/repo", branch="bb/t3"),
        # Checked out in the live environment's worktree (an agent switched branches there).
        Leftover("git-worktree", "branch", "/repo:bb/other", repo="/repo", branch="bb/other", path_key="t1"),
    ]
    findings = compare("local", Survey(found, absent=[f"{ROOT}/t2/repo"]), app.live_environments())
    assert [(o.kind, o.path) for o in findings.orphans] == [
        ("worktree", f"{ROOT}/t3/repo"),
        ("workspace", f"{ROOT}/stray/repo"),
        ("branch", "/repo:bb/t3"),
    ]
    assert [(m.environment_id, m.path) for m in findings.missing] == [(str(gone.id), f"{ROOT}/t2/repo")]
    assert live.path not in [o.path for o in findings.orphans]


def test_a_path_inside_or_around_a_recorded_one_is_never_an_orphan(app):
    ready(
        app, "t1", "k1", "/data/providers/personal-workspace/workspaces/k1", provider="personal-workspace", project=None
    )
    protected = protected_by(app.live_environments())
    assert protected.covers(
        Leftover("personal-workspace", "workspace", "/data/providers/personal-workspace/workspaces/k1/x")
    )
    assert protected.covers(Leftover("personal-workspace", "workspace", "/data/providers/personal-workspace"))
    assert not protected.covers(
        Leftover("personal-workspace", "workspace", "/data/providers/personal-workspace/workspaces/k10")
    )


def test_a_vanished_workspace_puts_its_environment_in_error_once_and_a_retry_creates_it_again(app):
    env = ready(app, "t1", "t1", f"{ROOT}/t1/repo")
    vanished = app.record_workspace_vanished(env.id, f"{ROOT}/t1/repo")
    assert vanished.status == EnvironmentStatus.ERROR and vanished.path is None
    assert "vanished" in vanished.status_message
    again = app.record_workspace_vanished(env.id, f"{ROOT}/t1/repo")
    assert again.version == vanished.version
    app.record_attempt_cleaned(env.id, 1)
    retried = app.retry(env.id, "t1", f"{ROOT}/t1/repo")
    assert retried.status == EnvironmentStatus.CREATING and retried.attempt == 2
    again_created = app.record_created(env.id, 2, f"{ROOT}/t1/repo", True, "main", None)
    assert again_created.setup_status == "running"  # the new workspace's setup runs, as the first one's did


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "first")
    return repo


def test_a_host_finds_its_leftovers_and_removes_them_after_saving_their_work(tmp_path, repo):
    data_dir = tmp_path / "data"
    workspaces = LocalWorkspaces(
        ProviderRegistry([GitWorktreeProvider(), PersonalWorkspaceProvider()]), data_dir, Lines()
    )
    stray = data_dir / "providers/git-worktree/worktrees/gone-thread/repo"
    stray.parent.mkdir(parents=True)
    git(repo, "worktree", "add", "-q", "-b", "bb/gone-thread", str(stray), "main")
    (stray / "notes.txt").write_text("unsaved work\n")
    git(repo, "branch", "bb/lonely", "main")
    personal = data_dir / "providers/personal-workspace/workspaces/p1"
    personal.mkdir(parents=True)

    survey = asyncio.run(
        workspaces.survey(SurveyRequest("local", [str(repo)], [("git-worktree", str(tmp_path / "nowhere"))]))
    )
    kinds = sorted((leftover.kind, leftover.path) for leftover in survey.found)
    assert kinds == sorted(
        [
            ("worktree", os.path.realpath(stray)),
            ("workspace", os.path.realpath(personal)),
            ("branch", f"{os.path.realpath(repo)}:bb/gone-thread"),
            ("branch", f"{os.path.realpath(repo)}:bb/lonely"),
        ]
    )
    assert survey.absent == [str(tmp_path / "nowhere")]

    nothing_live = protected_by([])
    results = [
        asyncio.run(workspaces.remove_leftover(LeftoverRemoval("local", leftover, nothing_live)))
        for leftover in survey.found
    ]
    assert all(isinstance(result, Removed) for result in results), results
    saved = [result.saved_ref for result in results if result.saved_ref]
    assert len(saved) == 1 and saved[0].startswith("refs/bb/saved/orphan-")
    assert git(repo, "show", f"{saved[0]}:notes.txt") == "unsaved work"
    assert not stray.exists() and not personal.exists()
    assert git(repo, "for-each-ref", "refs/heads/bb/") == ""
    assert asyncio.run(workspaces.survey(SurveyRequest("local", [str(repo)], []))).found == []


def test_a_host_keeps_a_leftover_that_a_live_environment_records_by_the_time_it_is_removed(tmp_path, app):
    data_dir = tmp_path / "data"
    workspaces = LocalWorkspaces(ProviderRegistry([PersonalWorkspaceProvider()]), data_dir, Lines())
    personal = data_dir / "providers/personal-workspace/workspaces/p1"
    personal.mkdir(parents=True)
    ready(app, "t1", "p1", os.path.realpath(personal), provider="personal-workspace", project=None)
    leftover = Leftover("personal-workspace", "workspace", os.path.realpath(personal), path_key="p1")
    result = asyncio.run(
        workspaces.remove_leftover(LeftoverRemoval("local", leftover, protected_by(app.live_environments())))
    )
    assert isinstance(result, RemoveFailed) and "kept" in result.message
    assert personal.is_dir()


def test_a_removed_environments_branch_whose_work_was_saved_goes_without_a_second_save(tmp_path, repo):
    git(repo, "switch", "-q", "-c", "bb/removed-thread")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "own work")
    tip = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-q", "main")
    git(repo, "update-ref", "refs/bb/saved/0b6f5b5e-8f3e-4d4e-9a51-1c7f9d1a2b3c", tip)  # as its removal saved it
    not_a_repo = tmp_path / "was-a-repo"
    not_a_repo.mkdir()
    workspaces = LocalWorkspaces(ProviderRegistry([GitWorktreeProvider()]), tmp_path / "data", Lines())

    survey = asyncio.run(workspaces.survey(SurveyRequest("local", [str(repo), str(not_a_repo)], [])))
    assert [leftover.path for leftover in survey.found] == [f"{os.path.realpath(repo)}:bb/removed-thread"]
    result = asyncio.run(workspaces.remove_leftover(LeftoverRemoval("local", survey.found[0], protected_by([]))))
    assert result == Removed(None)
    assert (
        git(repo, "for-each-ref", "--format=%(refname)", "refs/bb/", "refs/heads/bb/")
        == "refs/bb/saved/0b6f5b5e-8f3e-4d4e-9a51-1c7f9d1a2b3c"
    )


def test_an_empty_key_directory_and_a_plain_directory_under_the_worktrees_root_are_leftovers(tmp_path):
    root = tmp_path / "data" / "providers" / "git-worktree" / "worktrees"
    (root / "empty-key").mkdir(parents=True)
    (root / "half-made" / "repo").mkdir(parents=True)
    (root / "half-made" / "repo" / "file").write_text("no git here\n")
    workspaces = LocalWorkspaces(ProviderRegistry([GitWorktreeProvider()]), tmp_path / "data", Lines())

    survey = asyncio.run(workspaces.survey(SurveyRequest("local", [], [])))
    assert sorted((leftover.kind, leftover.path) for leftover in survey.found) == [
        ("workspace", os.path.realpath(root / "empty-key")),
        ("workspace", os.path.realpath(root / "half-made/repo")),
    ]
    for leftover in survey.found:
        assert (
            asyncio.run(workspaces.remove_leftover(LeftoverRemoval("local", leftover, protected_by([])))) == Removed()
        )
    assert list(root.iterdir()) == []
