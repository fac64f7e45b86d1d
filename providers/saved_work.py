"""Saving a worktree's work before its removal, and the retention of what was saved (SPEC §8.2).

What exists only in the worktree (uncommitted changes, tracked and untracked but not ignored, and
commits on no other branch) becomes one commit under `refs/bb/saved/<environmentId>` in the
project repository: its tree is the worktree as it was, its parent the branch head. The commit is
built on a temporary index, so the user's index, stash and branches stay as they were.

`bb doctor --fix` saves an orphaned worktree or branch the same way, under a key of its own
(`orphan-<hash>`, see `orphan_key`): no environment id names it.

A file the save would add that is larger than BB_SAVED_WORK_MAX_BYTES (untracked, or tracked and
changed) is left out, with its changes: a tenant's 50 MB dump saved into the project's `.git` would
stay there (git's objects outlive the ref) and grow every clone and backup of it. Those files are
named to whoever removes the workspace (`SavedWork.not_saved`), and are deleted with it.

Each save leaves a note `<provider data dir>/saved/<environmentId>` naming the repository, written
before the ref: the retention prune finds the repositories to look in there, on the host that
made the refs, without asking the core.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bb_environments.providers.contract import NotSavedFile
from bb_environments.providers.git_commands import run_git, run_git_or_none
from bb_environments.providers.host.crash_points import crash_point
from bb_environments.providers.host.durable_files import write_durably
from bb_environments.providers.host.saved_work_limit import SAVED_WORK_MAX_BYTES

SAVED_REF_PREFIX = "refs/bb/saved/"
SAVER_IDENTITY = {
    "GIT_AUTHOR_NAME": "bb environments",
    "GIT_AUTHOR_EMAIL": "bb-environments@localhost",
    "GIT_COMMITTER_NAME": "bb environments",
    "GIT_COMMITTER_EMAIL": "bb-environments@localhost",
}
"""Who the saved commit is by: bb made it, and a repository without user.name must save too."""
_SAVE_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|orphan-[0-9a-f]{16}")
"""An environment's id, or an orphan's key."""
ORPHAN_PREFIX = "orphan-"
NOT_SAVED_NAMED = 100
"""How many of the files left out are named (the largest), so that the removal's event stays small."""


@dataclass(frozen=True)
class SavedWork:
    ref: str | None
    """The saved ref, or None when there was nothing to save."""
    not_saved: list[NotSavedFile] = field(default_factory=list)
    """The largest of the files left out (at most NOT_SAVED_NAMED of them), largest first."""
    not_saved_count: int = 0
    """How many were left out in all."""


def not_saved_notice(saved: SavedWork, max_file_bytes: int, worktree: Path) -> str:
    """What the transcript says of the files a save left out: which, and where they went."""
    named = ", ".join(f"{file.path} ({_size(file.bytes)})" for file in saved.not_saved)
    more = saved.not_saved_count - len(saved.not_saved)
    where = f"in the saved work {saved.ref}" if saved.ref is not None else "anywhere"
    return (
        f"Not saved, being larger than BB_SAVED_WORK_MAX_BYTES ({_size(max_file_bytes)}): {named}"
        + (f" and {more} more" if more > 0 else "")
        + f". They are not {where}: they are deleted with the worktree {worktree}."
    )


def _size(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}".replace(".0 ", " ")
    return f"{size} bytes"


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


def save_work(
    repo: str, worktree: Path, key: str, notes_dir: Path, max_file_bytes: int = SAVED_WORK_MAX_BYTES
) -> SavedWork:
    """Save what exists only in `worktree`, but its files larger than `max_file_bytes` (see the
    module); `key` is the environment's id, or an orphan's key (`orphan_key`).

    A ref already there is the save, kept as it is: only this environment's removal writes it,
    before anything is deleted, and by a re-run (after a kill) the worktree may be half deleted.
    The files left out are found again by a re-run, as far as they are still there.
    Raises GitFailed when the work could not be saved: the worktree must then stay.
    """
    ref = saved_ref_name(key)
    saved_already = run_git_or_none(repo, "rev-parse", "--verify", "--quiet", ref) is not None
    if not _is_worktree_of(repo, worktree):
        # Gone, or no longer a worktree git can read (git's own removal was cut short after a
        # save that found nothing to save): there is nothing git could save.
        return SavedWork(ref if saved_already else None)
    too_large = _too_large(worktree, max_file_bytes)
    named = _readable(too_large[:NOT_SAVED_NAMED])
    if saved_already:
        return SavedWork(ref, named, len(too_large))
    head = run_git(str(worktree), "rev-parse", "--verify", "HEAD")
    tree = _worktree_tree(worktree, [file.path for file in too_large])
    if tree == run_git(str(worktree), "rev-parse", "--verify", "HEAD^{tree}") and not _has_own_commits(worktree):
        return SavedWork(None, named, len(too_large))
    source = f"the orphaned worktree {worktree}" if key.startswith(ORPHAN_PREFIX) else f"environment {key}"
    commit = run_git(
        str(worktree),
        "commit-tree",
        "-p",
        head,
        "-m",
        f"bb: work saved from {source}",
        tree,
        environment=SAVER_IDENTITY,
    )
    _save_as(repo, key, commit, notes_dir)
    return SavedWork(ref, named, len(too_large))


def save_commits(repo: str, commit: str, branch: str, key: str, notes_dir: Path) -> str | None:
    """Save `commit` (the tip of `branch`) when it has commits on no other branch; the saved ref,
    or None when every commit of it is on another branch. A ref already there is the save."""
    ref = saved_ref_name(key)
    if run_git_or_none(repo, "rev-parse", "--verify", "--quiet", ref) is not None:
        return ref
    # A commit that a removal saved already (the branch of a removed environment) is not saved twice.
    if not run_git(
        repo,
        "rev-list",
        "--max-count=1",
        commit,
        "--not",
        f"--exclude={branch}",
        "--branches",
        "--remotes",
        f"--glob={SAVED_REF_PREFIX}*",
    ):
        return None
    _save_as(repo, key, commit, notes_dir)
    return ref


def _save_as(repo: str, key: str, commit: str, notes_dir: Path) -> None:
    notes_dir.mkdir(parents=True, exist_ok=True)
    write_durably(notes_dir / key, repo.encode("utf-8", "surrogateescape"))
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
        listed = (
            run_git_or_none(repo, "for-each-ref", "--format=%(objectname) %(committerdate:unix)", ref)
            if os.path.isdir(repo)
            else ""
        )
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
    found = run_git_or_none(str(worktree), "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir")
    common = run_git_or_none(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    if found is None or common is None or len(found.splitlines()) != 2:
        return False
    toplevel, worktree_common = found.splitlines()
    return os.path.realpath(toplevel) == os.path.realpath(worktree) and os.path.realpath(
        worktree_common
    ) == os.path.realpath(common)


def _too_large(worktree: Path, max_file_bytes: int) -> list[NotSavedFile]:
    """The files a save would add to the repository's objects (untracked and not ignored, or
    tracked and changed) that are larger than `max_file_bytes`, largest first."""
    listed = run_git(str(worktree), "ls-files", "-z", "--others", "--exclude-standard", "--modified")
    too_large = []
    for path in dict.fromkeys(name for name in listed.split("\0") if name):
        try:
            info = os.lstat(worktree / path)
        except OSError:
            continue  # deleted: nothing to add
        if stat.S_ISREG(info.st_mode) and info.st_size > max_file_bytes:
            too_large.append(NotSavedFile(path, info.st_size))
    return sorted(too_large, key=lambda file: (-file.bytes, file.path))


def _readable(files: list[NotSavedFile]) -> list[NotSavedFile]:
    """`files` named as text can say: a name that is not UTF-8 has its bytes replaced (for the event
    and the transcript; the files themselves were found by their real names)."""
    return [
        NotSavedFile(file.path.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), file.bytes)
        for file in files
    ]


def _worktree_tree(worktree: Path, left_out: Sequence[str] = ()) -> str:
    """The tree of the worktree's files as they are: its index's entries (staged and tracked files,
    ignored or not) updated from the files, plus every untracked file that is not ignored; but
    `left_out`, whose index entries stay as they were (none, for an untracked file). Left out of
    `git add` itself, not removed afterwards: the add would write their objects into the repository."""
    index = run_git(str(worktree), "rev-parse", "--path-format=absolute", "--git-path", "index")
    with tempfile.TemporaryDirectory(prefix="bb-save-") as scratch:
        temporary = os.path.join(scratch, "index")
        environment = {"GIT_INDEX_FILE": temporary}
        if os.path.exists(index):
            shutil.copyfile(index, temporary)
        else:
            run_git(str(worktree), "read-tree", "HEAD", environment=environment)
        run_git(
            str(worktree),
            "add",
            "--all",
            "--",
            ".",
            *(f":(exclude,literal){path}" for path in left_out),
            environment=environment,
        )
        return run_git(str(worktree), "write-tree", environment=environment)


def _has_own_commits(worktree: Path) -> bool:
    """Whether HEAD has commits that no other branch (local or remote-tracking) has."""
    branch = run_git_or_none(str(worktree), "symbolic-ref", "--quiet", "HEAD")
    # --exclude takes a glob (a ref name holds none of its special characters), matched against
    # the names --branches lists: without refs/heads/.
    others = [f"--exclude={branch.removeprefix('refs/heads/')}"] if branch else []
    return bool(
        run_git(str(worktree), "rev-list", "--max-count=1", "HEAD", "--not", *others, "--branches", "--remotes")
    )


def saved_notes_dir(provider_data_dir: Path) -> Path:
    """Where the git-worktree provider whose data dir is `provider_data_dir` notes its saves."""
    return provider_data_dir / "saved"


def _notes(notes_dir: Path) -> list[Path]:
    try:
        return sorted(entry for entry in notes_dir.iterdir() if _SAVE_KEY.fullmatch(entry.name))
    except FileNotFoundError:
        return []
