"""Work that exists only in a worktree is saved under refs/bb/saved/<id> before the worktree goes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from bb_environments.providers.contract import NotSavedFile, Removed, RemoveFailed
from bb_environments.providers.git_worktree import GitWorktreeProvider
from bb_environments.providers.saved_work import prune_saved_refs, save_work, saved_notes_dir
from tests.conftest import RecordingReporter
from tests.unit.test_git_worktree_provider import ENVIRONMENT_ID, create, remove_context

Git = Callable[..., str]
SAVED_REF = f"refs/bb/saved/{ENVIRONMENT_ID}"


@pytest.fixture
def provider() -> GitWorktreeProvider:
    return GitWorktreeProvider()


def show(repo: Path, revision_path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", revision_path], capture_output=True, check=True).stdout


def tree_names(repo: Path, revision: str) -> list[bytes]:
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "-z", "--name-only", revision], capture_output=True, check=True
    ).stdout
    return sorted(name for name in listed.split(b"\0") if name)


def saved_refs(git: Git, repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname)", "refs/bb").splitlines()


def user_state(git: Git, repo: Path) -> tuple[str, str, str]:
    """The user's index (its content hash), stash and branches."""
    index = hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest()
    return (
        index,
        git(repo, "stash", "list"),
        git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads"),
    )


def remove(provider: GitWorktreeProvider, repo: Path, data_dir: Path, path: str) -> Removed | RemoveFailed:
    return provider.remove(remove_context(repo, data_dir, path))


def test_a_commit_of_its_own_a_modified_and_an_untracked_file_are_saved_byte_for_byte(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    (git_repo / ".gitignore").write_text("*.log\n")
    git(git_repo, "add", ".gitignore")
    git(git_repo, "commit", "--quiet", "-m", "ignore logs")
    (git_repo / "README.md").write_text("the user's own uncommitted edit\n")
    git(git_repo, "stash", "--quiet")
    (git_repo / "staged.txt").write_text("staged by the user\n")
    git(git_repo, "add", "staged.txt")
    worktree = Path(create(provider, git_repo, data_dir).path)
    (worktree / "feature.py").write_text("print('committed')\n")
    git(worktree, "add", "feature.py")
    git(worktree, "commit", "--quiet", "-m", "a commit of its own")
    head = git(worktree, "rev-parse", "HEAD")
    (worktree / "README.md").write_bytes(b"modified \x00\xff bytes\n")
    (worktree / "notes").mkdir()
    (worktree / "notes" / "untracked.md").write_bytes(b"untracked\r\nwork\n")
    (worktree / "build.log").write_text("ignored\n")
    before = user_state(git, git_repo)

    result = remove(provider, git_repo, data_dir, str(worktree))

    assert result == Removed(SAVED_REF)
    assert not worktree.exists()
    assert show(git_repo, f"{SAVED_REF}:feature.py") == b"print('committed')\n"
    assert show(git_repo, f"{SAVED_REF}:README.md") == b"modified \x00\xff bytes\n"
    assert show(git_repo, f"{SAVED_REF}:notes/untracked.md") == b"untracked\r\nwork\n"
    assert tree_names(git_repo, SAVED_REF) == [b".gitignore", b"README.md", b"feature.py", b"notes/untracked.md"]
    assert git(git_repo, "rev-parse", f"{SAVED_REF}^@") == head
    assert user_state(git, git_repo) == before
    assert git(git_repo, "stash", "list")  # the user's stash is still there


def test_file_names_git_would_quote_are_saved(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = Path(create(provider, git_repo, data_dir).path)
    names = [b"with space.txt", b"new\nline.txt", b"caf\xe9-latin1.txt", b'quote"and\\back.txt', b"-dash.txt"]
    for name in names:
        with open(os.path.join(os.fsencode(worktree), name), "wb") as file:
            file.write(b"content of " + name)

    assert remove(provider, git_repo, data_dir, str(worktree)) == Removed(SAVED_REF)

    assert tree_names(git_repo, SAVED_REF) == sorted([b"README.md", *names])
    for name in names:
        blob = subprocess.run(
            ["git", "-C", str(git_repo), "cat-file", "blob", "--", b"%s:%s" % (SAVED_REF.encode(), name)],
            capture_output=True,
            check=True,
        ).stdout
        assert blob == b"content of " + name


def test_files_larger_than_the_limit_are_left_out_of_the_save_and_of_the_repository_and_named(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BB_SAVED_WORK_MAX_BYTES", "1000")
    (git_repo / "fixture.bin").write_bytes(b"f" * 5000)  # tracked and large: already in the repository
    git(git_repo, "add", "fixture.bin")
    git(git_repo, "commit", "--quiet", "-m", "a large fixture")
    worktree = Path(create(provider, git_repo, data_dir).path)
    dump, changed = b"d" * 4000, b"c" * 2000
    (worktree / "dump.sql").write_bytes(dump)
    (worktree / "fixture.bin").write_bytes(changed)
    (worktree / "small.txt").write_bytes(b"s" * 1000)
    report = RecordingReporter()

    result = provider.remove(replace(remove_context(git_repo, data_dir, str(worktree)), report=report))

    assert result == Removed(SAVED_REF, [NotSavedFile("dump.sql", 4000), NotSavedFile("fixture.bin", 2000)])
    assert tree_names(git_repo, SAVED_REF) == [b"README.md", b"fixture.bin", b"small.txt"]
    assert show(git_repo, f"{SAVED_REF}:fixture.bin") == b"f" * 5000  # as committed: its change is left out
    for content in (dump, changed):
        blob = (
            subprocess.run(
                ["git", "-C", str(git_repo), "hash-object", "--stdin"], input=content, capture_output=True, check=True
            )
            .stdout.decode()
            .strip()
        )
        assert subprocess.run(["git", "-C", str(git_repo), "cat-file", "-e", blob]).returncode != 0, (
            "a file left out of the save was written into the repository all the same"
        )
    assert report.logs[-1] == (
        "Not saved, being larger than BB_SAVED_WORK_MAX_BYTES (1000 bytes): dump.sql (3.9 KiB), "
        f"fixture.bin (2 KiB). They are not in the saved work {SAVED_REF}: they are deleted with the "
        f"worktree {worktree}."
    )


def test_a_clean_worktree_whose_commits_are_on_other_branches_saves_nothing(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = Path(create(provider, git_repo, data_dir).path)
    (worktree / "done.txt").write_text("merged\n")
    git(worktree, "add", "done.txt")
    git(worktree, "commit", "--quiet", "-m", "merged work")
    git(git_repo, "merge", "--quiet", "--ff-only", "bb/thread-1")

    assert remove(provider, git_repo, data_dir, str(worktree)) == Removed(None)
    assert saved_refs(git, git_repo) == []


def test_a_clean_worktree_with_a_commit_on_no_other_branch_saves_that_commit(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = create(provider, git_repo, data_dir).path
    git(Path(worktree), "switch", "--quiet", "-c", "renamed-by-the-agent")
    (Path(worktree) / "only-here.txt").write_text("nowhere else\n")
    git(Path(worktree), "add", "only-here.txt")
    git(Path(worktree), "commit", "--quiet", "-m", "unpushed")
    head = git(Path(worktree), "rev-parse", "HEAD")

    assert remove(provider, git_repo, data_dir, worktree) == Removed(SAVED_REF)
    assert git(git_repo, "rev-parse", f"{SAVED_REF}^{{tree}}") == git(git_repo, "rev-parse", f"{head}^{{tree}}")
    assert git(git_repo, "rev-parse", f"{SAVED_REF}^@") == head


def test_a_deleted_tracked_file_is_deleted_in_the_saved_tree(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = Path(create(provider, git_repo, data_dir).path)
    (worktree / "README.md").unlink()
    (worktree / "instead.txt").write_text("x\n")

    assert remove(provider, git_repo, data_dir, str(worktree)) == Removed(SAVED_REF)
    assert tree_names(git_repo, SAVED_REF) == [b"instead.txt"]


def test_a_removal_run_again_after_the_save_keeps_the_one_ref_and_names_it(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = Path(create(provider, git_repo, data_dir).path)
    (worktree / "work.txt").write_text("precious\n")
    # A kill just after the ref was written: the worktree is still there.
    assert save_work(str(git_repo), worktree, ENVIRONMENT_ID, saved_notes_dir(data_dir)).ref == SAVED_REF
    first = git(git_repo, "rev-parse", SAVED_REF)
    (worktree / "work.txt").unlink()  # as git's own removal, cut short, might have left it

    assert remove(provider, git_repo, data_dir, str(worktree)) == Removed(SAVED_REF)
    assert remove(provider, git_repo, data_dir, str(worktree)) == Removed(SAVED_REF)  # the worktree is gone now

    assert saved_refs(git, git_repo) == [SAVED_REF]
    assert git(git_repo, "rev-parse", SAVED_REF) == first
    assert show(git_repo, f"{SAVED_REF}:work.txt") == b"precious\n"


def test_a_save_that_fails_keeps_the_worktree_and_fails_the_removal(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = Path(create(provider, git_repo, data_dir).path)
    (worktree / "work.txt").write_text("precious\n")
    (git_repo / ".git" / "refs" / "bb").write_text("not a directory: no ref can be made under it\n")

    result = remove(provider, git_repo, data_dir, str(worktree))

    assert isinstance(result, RemoveFailed) and "could not be saved, so it is kept" in result.message
    assert (worktree / "work.txt").read_text() == "precious\n"
    assert str(worktree) in git(git_repo, "worktree", "list")


def test_the_worktree_of_a_failed_create_is_removed_without_a_save(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    worktree = Path(create(provider, git_repo, data_dir).path)
    (worktree / "half-copied.txt").write_text("left by the failed attempt\n")

    assert provider.remove(remove_context(git_repo, data_dir, None)) == Removed(None)
    assert saved_refs(git, git_repo) == []


def test_the_retention_prune_deletes_an_old_saved_ref_and_keeps_a_young_one(
    git_repo: Path, data_dir: Path, git: Git, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = saved_notes_dir(data_dir)
    old_id, young_id = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
    day = 24 * 3600
    for environment_id, age in ((old_id, 31 * day), (young_id, day)):
        worktree = tmp_path / environment_id
        git(git_repo, "worktree", "add", "--quiet", "-b", environment_id, str(worktree))
        (worktree / "work.txt").write_text(environment_id)
        saved_at = int(time.time()) - age
        monkeypatch.setenv("GIT_COMMITTER_DATE", f"@{saved_at} +0000")
        save_work(str(git_repo), worktree, environment_id, notes)
        os.utime(notes / environment_id, (saved_at, saved_at))

    pruned = prune_saved_refs(notes, 30 * day)

    assert pruned == [f"refs/bb/saved/{old_id}"]
    assert saved_refs(git, git_repo) == [f"refs/bb/saved/{young_id}"]
    assert sorted(path.name for path in notes.iterdir()) == [young_id]
    assert prune_saved_refs(notes, 30 * day) == []
