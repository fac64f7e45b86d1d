"""Shared fixtures: throwaway git repositories, and what was fsynced."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

GIT_IDENTITY = ("-c", "user.name=Test", "-c", "user.email=test@example.com")


def run_git(repo: Path, *args: str) -> str:
    """Run git in `repo` with a fixed identity; return stdout, fail the test on error."""
    completed = subprocess.run(
        ["git", *GIT_IDENTITY, "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return completed.stdout.strip()


_CGROUPS_BEFORE = pytest.StashKey[set[Path]]()


def _runs_the_session(config: pytest.Config) -> bool:
    """The process that starts and ends the whole run: not one of pytest-xdist's workers."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    from bb_environments.providers.host.containment import cgroup_roots

    session.config.stash[_CGROUPS_BEFORE] = {
        entry for root in cgroup_roots() if root.is_dir() for entry in root.iterdir()
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A test that stops a service while its environments live leaves their (empty) cgroups, which
    only a removal deletes: the run deletes the empty ones it made, so runs do not pile them up.
    Only once every worker has finished: a worker's end would delete the cgroup another worker's
    test has just made and not yet moved a process into."""
    from bb_environments.providers.host.containment import cgroup_roots

    if not _runs_the_session(session.config):
        return
    before = session.config.stash.get(_CGROUPS_BEFORE, set())
    for entry in (entry for root in cgroup_roots() if root.is_dir() for entry in root.iterdir()):
        if entry.is_dir() and entry not in before:
            try:
                entry.rmdir()  # refused while a process is still in it: then it is kept
            except OSError:
                pass


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A repository at `tmp_path/repo` with one commit (README.md) on `main`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    run_git(repo, "init", "--quiet", "--initial-branch=main")
    (repo / "README.md").write_text("hello\n")
    run_git(repo, "add", "README.md")
    run_git(repo, "commit", "--quiet", "-m", "initial")
    return repo


@pytest.fixture
def git() -> Callable[..., str]:
    """`git(repo, *args)`: run git in a test repo (see `run_git`)."""
    return run_git


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A provider's own data directory."""
    directory = tmp_path / "data"
    directory.mkdir()
    return directory


class RecordingReporter:
    """A provider's `report` that keeps what it was told."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.logs: list[str] = []

    def step(self, text: str) -> None:
        self.steps.append(text)

    def log(self, text: str) -> None:
        self.logs.append(text)


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the files and directories fsynced in this process during the test, in order
    (they are still fsynced)."""
    paths: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths
