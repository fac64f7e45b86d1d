"""What the git-worktree provider's layout left on this host, for `bb doctor`, and its removal.

The layout is `<data_dir>/worktrees/<path_key>/<repo-dir-name>`, registered as a worktree in the
project repository, on a branch `bb/<path_key>` unless the thread named another. A leftover is
a directory under the root (a `worktree` when a scanned repository registers it, else a
`workspace`, as is an empty key directory), a registration under the root whose directory is gone (a `worktree`), or a `bb/`
branch of a scanned repository that no worktree outside the root has checked out.

Removal saves first, then deletes, so a kill between the two leaves a leftover that the next
doctor saves again (the same ref: the save is kept) and removes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from bb_environments.providers.contract import Leftover, SilentReporter
from bb_environments.providers.git_commands import GitFailed, run_git, run_git_or_none
from bb_environments.providers.host.saved_work_limit import saved_work_max_bytes
from bb_environments.providers.saved_work import orphan_key, save_commits, save_work, saved_notes_dir
from bb_environments.providers.workspace_files import is_strictly_inside, remove_if_empty, stop_processes_in

PROVIDER_ID = "git-worktree"
BRANCH_PREFIX = "bb/"


class Registered(Protocol):
    """A worktree as `git worktree list` names it."""

    @property
    def path(self) -> str: ...
    @property
    def branch(self) -> str | None: ...


ListWorktrees = Callable[[str], Sequence[Registered]]
RemoveWorktree = Callable[[str | None, Path], None]


def worktree_leftovers(root: Path, repos: list[str], list_worktrees: ListWorktrees) -> list[Leftover]:
    """Everything of the layout under `root` and in `repos`, directories before branches."""
    canonical_root = os.path.realpath(root)
    found: dict[str, Leftover] = {}
    branches: list[Leftover] = []
    for repo in _readable(repos):
        # Where each branch is checked out: outside the root, the user works on it; inside, it
        # goes with its worktree (a live environment's worktree keeps its branch).
        checked_out: dict[str, str | None] = {}
        try:
            registered = list_worktrees(repo)
        except GitFailed:
            continue  # no longer a repository: it holds no worktree nor branch of ours
        for entry in registered:
            path = os.path.realpath(entry.path)
            key = _key(path, canonical_root) if _inside(path, canonical_root) else None
            if key is not None:
                found[path] = Leftover(PROVIDER_ID, "worktree", path, repo=repo, path_key=key)
            if entry.branch:
                checked_out[entry.branch] = key
        listed = run_git_or_none(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/" + BRANCH_PREFIX)
        for branch in (listed or "").splitlines():
            if branch in checked_out and checked_out[branch] is None:
                continue
            branches.append(
                Leftover(
                    PROVIDER_ID,
                    "branch",
                    branch_place(repo, branch),
                    repo=repo,
                    branch=branch,
                    path_key=checked_out.get(branch),
                )
            )
    for key_dir in _entries(Path(canonical_root)):
        # A key directory with nothing in it is a leftover too (a removal cut short before its end).
        for directory in _entries(key_dir) or ([key_dir] if not any(key_dir.iterdir()) else []):
            path = os.path.realpath(directory)
            found.setdefault(path, Leftover(PROVIDER_ID, "workspace", path, path_key=key_dir.name))
    return sorted(found.values(), key=lambda leftover: leftover.path) + branches


def remove_worktree_leftover(
    data_dir: Path, root: Path, leftover: Leftover, remove_worktree: RemoveWorktree
) -> str | None:
    """Save the leftover's work (see the module's docstring), then remove it; the saved ref."""
    notes = saved_notes_dir(data_dir)
    if leftover.kind == "branch":
        assert leftover.repo is not None and leftover.branch is not None  # the survey names both
        return _remove_branch(leftover.repo, leftover.branch, notes)
    path = Path(leftover.path)
    if not is_strictly_inside(path, root):
        raise ValueError(f"refusing to remove {path}: it is not inside {root}")
    repo = leftover.repo or _repository_of(path)
    saved = None
    if os.path.isdir(path):
        stop_processes_in(path, SilentReporter(), "worktree")  # nothing writes to it any more
        if repo is not None:
            head = run_git_or_none(str(path), "rev-parse", "--verify", "--quiet", "HEAD") or ""
            saved = save_work(repo, path, orphan_key(os.path.realpath(path), head), notes, saved_work_max_bytes()).ref
    remove_worktree(repo, path)
    if is_strictly_inside(path.parent, root):
        remove_if_empty(path.parent)
    return saved


def branch_place(repo: str, branch: str) -> str:
    """How a branch is named among paths: `<repo>:<branch>`."""
    return f"{repo}:{branch}"


def _remove_branch(repo: str, branch: str, notes: Path) -> str | None:
    ref = "refs/heads/" + branch
    tip = run_git_or_none(repo, "rev-parse", "--verify", "--quiet", ref)
    if tip is None:
        return None  # deleted meanwhile, or by an earlier --fix that a kill cut short after it
    worktrees = run_git(repo, "worktree", "list", "--porcelain")
    if f"branch {ref}\n" in worktrees + "\n":
        raise GitFailed(f"branch {branch} is checked out in a worktree of {repo}; remove that first")
    saved = save_commits(repo, tip, branch, orphan_key(repo, branch, tip), notes)
    # The old value makes git refuse if the branch moved since it was saved.
    run_git(repo, "update-ref", "-d", ref, tip)
    return saved


def _repository_of(worktree: Path) -> str | None:
    """The repository whose worktree `worktree` is, when git reads it as one of its own top level;
    a `.git` that git cannot read keeps it (its work could not be saved), raised as GitFailed."""
    if not os.path.lexists(worktree / ".git"):
        return None
    found = run_git(str(worktree), "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir")
    toplevel, common = (found.splitlines() + ["", ""])[:2]
    if os.path.realpath(toplevel) != os.path.realpath(worktree) or os.path.basename(common) != ".git":
        raise GitFailed(f"{worktree} is not a worktree whose repository could be found; it is kept")
    return os.path.dirname(common)


def _readable(repos: list[str]) -> list[str]:
    return sorted({os.path.realpath(repo) for repo in repos if os.path.isdir(repo)})


def _inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _key(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) + 1 :].split("/", 1)[0]


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(entry for entry in directory.iterdir() if entry.is_dir() and not entry.is_symlink())
    except (FileNotFoundError, NotADirectoryError):
        return []
