import os
import stat
import threading
from pathlib import Path

import pytest

from bb_environments.providers.worktree_include import copy_worktree_includes


@pytest.fixture
def target(tmp_path: Path) -> Path:
    directory = tmp_path / "worktree"
    directory.mkdir()
    return directory


def copy(source: Path, target: Path, cancelled: threading.Event | None = None):
    return copy_worktree_includes(source, target, cancelled or threading.Event())


def test_no_include_file_copies_nothing(git_repo: Path, target: Path) -> None:
    (git_repo / ".env").write_text("SECRET=1\n")
    report = copy(git_repo, target)
    assert (report.copied, report.skipped, report.error) == ([], [], None)


def test_comment_only_include_file_copies_nothing(git_repo: Path, target: Path) -> None:
    (git_repo / ".worktreeinclude").write_text("# nothing yet\n\n")
    (git_repo / ".env").write_text("SECRET=1\n")
    assert copy(git_repo, target).copied == []


def test_copies_matching_untracked_files_with_their_mode(git_repo: Path, target: Path) -> None:
    (git_repo / ".worktreeinclude").write_text(".env\nconfig/*.local\n!config/skip.local\n")
    (git_repo / ".env").write_text("SECRET=1\n")
    (git_repo / ".env").chmod(0o640)
    (git_repo / "config").mkdir()
    (git_repo / "config" / "db.local").write_text("db\n")
    (git_repo / "config" / "skip.local").write_text("skip\n")
    (git_repo / "unrelated.txt").write_text("no\n")

    report = copy(git_repo, target)

    assert sorted(report.copied) == [".env", "config/db.local"]
    assert (target / ".env").read_text() == "SECRET=1\n"
    assert stat.S_IMODE((target / ".env").stat().st_mode) == 0o640
    assert (target / "config" / "db.local").read_text() == "db\n"
    assert not (target / "config" / "skip.local").exists()
    assert not (target / "unrelated.txt").exists()


def test_tracked_files_are_not_copied(git_repo: Path, target: Path) -> None:
    (git_repo / ".worktreeinclude").write_text("README.md\n")
    assert copy(git_repo, target).copied == []


def test_never_overwrites_an_existing_file(git_repo: Path, target: Path) -> None:
    (git_repo / ".worktreeinclude").write_text(".env\n")
    (git_repo / ".env").write_text("from source\n")
    (target / ".env").write_text("already here\n")

    report = copy(git_repo, target)

    assert report.skipped == [(".env", "already exists in the worktree")]
    assert (target / ".env").read_text() == "already here\n"


def test_never_writes_through_a_planted_symlink(git_repo: Path, target: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    (git_repo / ".worktreeinclude").write_text(".env\n")
    (git_repo / ".env").write_text("SECRET=1\n")
    (target / ".env").symlink_to(outside)  # dangling: points at a file that does not exist yet

    report = copy(git_repo, target)

    assert report.skipped == [(".env", "already exists in the worktree")]
    assert not outside.exists()


def test_refuses_a_destination_whose_parent_escapes(git_repo: Path, target: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (git_repo / ".worktreeinclude").write_text("config/\n")
    (git_repo / "config").mkdir()
    (git_repo / "config" / "secret").write_text("s\n")
    (target / "config").symlink_to(outside, target_is_directory=True)

    report = copy(git_repo, target)

    assert report.skipped == [("config/secret", "destination escapes the worktree")]
    assert os.listdir(outside) == []


def test_skips_source_symlinks(git_repo: Path, target: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s\n")
    (git_repo / ".worktreeinclude").write_text("link\n")
    (git_repo / "link").symlink_to(secret)

    report = copy(git_repo, target)

    assert report.skipped == [("link", "symlink")]
    assert not os.path.lexists(target / "link")


def test_failing_git_is_reported_not_raised(tmp_path: Path, target: Path) -> None:
    not_a_repo = tmp_path / "plain"
    not_a_repo.mkdir()
    (not_a_repo / ".worktreeinclude").write_text(".env\n")

    report = copy(not_a_repo, target)

    assert report.copied == []
    assert report.error is not None and "git ls-files failed" in report.error


def test_stops_when_cancelled(git_repo: Path, target: Path) -> None:
    (git_repo / ".worktreeinclude").write_text("*.local\n")
    for name in ("a.local", "b.local"):
        (git_repo / name).write_text(name)
    cancelled = threading.Event()
    cancelled.set()

    report = copy(git_repo, target, cancelled)

    assert report.copied == [] and os.listdir(target) == []
