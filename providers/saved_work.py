"""Saving a worktree's work before its removal, and the retention of what was saved (SPEC §8.2).

What exists only in the worktree (uncommitted changes, tracked and untracked but not ignored, and
commits on no other branch) becomes one commit under `refs/bb/saved/<environmentId>` in the
project repository: its tree is the worktree as it was, its parent the branch head. The commit is
built on a temporary index, so the user's index, stash and branches stay as they were.

`bb doctor --fix` saves an orphaned worktree or branch the same way, under a key of its own
(`orphan-<hash>`, see `orphan_key`): no environment id names it.

Each save leaves a note `<provider data dir>/saved/<environmentId>` naming the repository, written
before the ref: the retention prune finds the repositories to look in there, on the host that
made the refs, without asking the core.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from bb_environments.providers.git_commands import GitFailed, run_git, run_git_or_none
from bb_environments.providers.host.crash_points import crash_point

SAVED_REF_PREFIX = "refs/bb/saved/"
SAVER_IDENTITY = {
    "GIT_AUTHOR_NAME": "bb environments", "GIT_AUTHOR_EMAIL": "bb-environments@localhost",
    "GIT_COMMITTER_NAME": "bb environments", "GIT_COMMITTER_EMAIL": "bb-environments@localhost",
}
"""Who the saved commit is by: bb made it, and a repository without user.name must save too."""
_SAVE_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|orphan-[0-9a-f]{16}")
"""An environment's id, or an orphan's key."""
ORPHAN_PREFIX = "orphan-"


def saved_ref_name(key: str) -> str:
    if not _SAVE_KEY.fullmatch(key):
        raise ValueError(f"environment id {key!r} cannot name a saved ref")
    return SAVED_REF_PREFIX + key


def orphan_key(*identity: str) -> str:
    """The save key of an orphan that `identity` (its place, and the commit it stands on) names:
    no environment id can be it, and a later orphan at the same place on another commit gets
    another, so an earlier save never stands in for its work."""
    digest = hashlib.sha256("\0".join(identity).encode("utf-8", "surrogateescape")).hexdigest()
    return ORPHAN_PREFIX + digest[:16]


def save_work(repo: str, worktree: Path, key: str, notes_dir: Path) -> str | None:
    """Save what exists only in `worktree`; the saved ref, or None when there was nothing to save.
    `key` is the environment's id, or an orphan's key (`orphan_key`).

    A ref already there is the save, kept as it is: only this environment's removal writes it,
    before anything is deleted, and by a re-run (after a kill) the worktree may be half deleted.
    Raises GitFailed when the work could not be saved: the worktree must then stay.
    """
    ref = saved_ref_name(key)
    if run_git_or_none(repo, "rev-parse", "--verify", "--quiet", ref) is not None:
        return ref
    if not _is_worktree_of(repo, worktree):
        # Gone, or no longer a worktree git can read (git's own removal was cut short after a
        # save that found nothing to save): there is nothing git could save.
        return None
    head = run_git(str(worktree), "rev-parse", "--verify", "HEAD")
    tree = _worktree_tree(worktree)
    if tree == run_git(str(worktree), "rev-parse", "--verify", "HEAD^{tree}") and not _has_own_commits(worktree):
        return None
    source = f"the orphaned worktree {worktree}" if key.startswith(ORPHAN_PREFIX) else f"environment {key}"
    commit = run_git(str(worktree), "commit-tree", "-p", head, "-m", f"bb: work saved from {source}",
                     tree, environment=SAVER_IDENTITY)
    _save_as(repo, key, commit, notes_dir)
    return ref


def save_commits(repo: str, commit: str, branch: str, key: str, notes_dir: Path) -> str | None:
    """Save `commit` (the tip of `branch`) when it has commits on no other branch; the saved ref,
    or None when every commit of it is on another branch. A ref already there is the save."""
    ref = saved_ref_name(key)
    if run_git_or_none(repo, "rev-parse", "--verify", "--quiet", ref) is not None:
        return ref
    # A commit that a removal saved already (the branch of a removed environment) is not saved twice.
    if not run_git(repo, "rev-list", "--max-count=1", commit, "--not", f"--exclude={branch}",
                   "--branches", "--remotes", f"--glob={SAVED_REF_PREFIX}*"):
        return None
    _save_as(repo, key, commit, notes_dir)
    return ref


def _save_as(repo: str, key: str, commit: str, notes_dir: Path) -> None:
    _write_note(notes_dir, key, repo)
    # The expected old value (none) makes a second writer of the same ref fail instead of replacing it.
    run_git(repo, "update-ref", "-m", "bb: work saved before removal", saved_ref_name(key), commit, "")
    crash_point("work-saved")


def prune_saved_refs(notes_dir: Path, max_age_s: float, now: float | None = None) -> list[str]:
    """Delete the saved refs older than `max_age_s` (by their commit's time) that this host made;
    the refs deleted. A note younger than that cannot have an older ref, and is not looked at."""
    cutoff = (time.time() if now is None else now) - max_age_s
    pruned: list[str] = []
    for note in _notes(notes_dir):
        try:
            if note.stat().st_mtime >= cutoff:
                continue
            repo = note.read_text(encoding="utf-8", errors="surrogateescape")
        except FileNotFoundError:
            continue
        ref = saved_ref_name(note.name)
        listed = run_git_or_none(repo, "for-each-ref", "--format=%(objectname) %(committerdate:unix)", ref) \
            if os.path.isdir(repo) else ""
        if listed is None:
            continue  # the repository cannot be read now: try again at the next sweep
        if listed:
            commit, _, saved_at = listed.partition(" ")
            if int(saved_at) >= cutoff:
                continue
            run_git(repo, "update-ref", "-d", ref, commit)
            pruned.append(ref)
        note.unlink(missing_ok=True)
    return pruned


def _is_worktree_of(repo: str, worktree: Path) -> bool:
    """Whether git reads `worktree` as its own top level, in `repo`: without its `.git` file, git
    would walk up to whatever repository encloses it."""
    if not worktree.is_dir():
        return False
    found = run_git_or_none(str(worktree), "rev-parse", "--path-format=absolute", "--show-toplevel",
                            "--git-common-dir")
    common = run_git_or_none(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    if found is None or common is None or len(found.splitlines()) != 2:
        return False
    toplevel, worktree_common = found.splitlines()
    return os.path.realpath(toplevel) == os.path.realpath(worktree) and \
        os.path.realpath(worktree_common) == os.path.realpath(common)


def _worktree_tree(worktree: Path) -> str:
    """The tree of the worktree's files as they are: its index's entries (staged and tracked files,
    ignored or not) updated from the files, plus every untracked file that is not ignored."""
    index = run_git(str(worktree), "rev-parse", "--path-format=absolute", "--git-path", "index")
    with tempfile.TemporaryDirectory(prefix="bb-save-") as scratch:
        temporary = os.path.join(scratch, "index")
        environment = {"GIT_INDEX_FILE": temporary}
        if os.path.exists(index):
            shutil.copyfile(index, temporary)
        else:
            run_git(str(worktree), "read-tree", "HEAD", environment=environment)
        run_git(str(worktree), "add", "--all", environment=environment)
        return run_git(str(worktree), "write-tree", environment=environment)


def _has_own_commits(worktree: Path) -> bool:
    """Whether HEAD has commits that no other branch (local or remote-tracking) has."""
    branch = run_git_or_none(str(worktree), "symbolic-ref", "--quiet", "HEAD")
    # --exclude takes a glob (a ref name holds none of its special characters), matched against
    # the names --branches lists: without refs/heads/.
    others = [f"--exclude={branch.removeprefix('refs/heads/')}"] if branch else []
    return bool(run_git(str(worktree), "rev-list", "--max-count=1", "HEAD", "--not",
                        *others, "--branches", "--remotes"))


def _write_note(notes_dir: Path, key: str, repo: str) -> None:
    notes_dir.mkdir(parents=True, exist_ok=True)
    temporary = notes_dir / f".{key}.tmp"
    temporary.write_text(repo, encoding="utf-8", errors="surrogateescape")
    os.replace(temporary, notes_dir / key)


def saved_notes_dir(provider_data_dir: Path) -> Path:
    """Where the git-worktree provider whose data dir is `provider_data_dir` notes its saves."""
    return provider_data_dir / "saved"


def _notes(notes_dir: Path) -> list[Path]:
    try:
        return sorted(entry for entry in notes_dir.iterdir() if _SAVE_KEY.fullmatch(entry.name))
    except FileNotFoundError:
        return []
