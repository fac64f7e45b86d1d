"""What git says of a project's repository: its top level, its branches and commits, and its default
branch, each checked the way a worktree's inputs need it (an `InvalidInputs` names what is wrong).

A spawn asks the same questions several times (validate, plan, create): the top level and the
default branch are remembered while the files git reads them from stay the same.
"""

from __future__ import annotations

import hashlib
import os
import stat

from bb_environments.domain.hook_operations import SCRIPT_NAMES
from bb_environments.providers.contract import InvalidInputs
from bb_environments.providers.git_commands import (
    GitFailed,
    branch_exists,
    is_commit,
    run_git,
    run_git_or_none,
    unsafe_refusal,
)
from bb_environments.providers.refnames import validate_branch_name, validate_revision

DEFAULT_BRANCH_REFS = ("refs/remotes/origin/HEAD", "refs/heads/main", "refs/heads/master")


def require_repo(project_path: str | None) -> str:
    """The repository's top-level directory, or InvalidInputs when it cannot host a worktree."""
    if project_path is None:
        raise InvalidInputs("project path: a git checkout is required for a worktree")
    if not os.path.isdir(project_path):
        raise InvalidInputs(f"project path: {project_path} does not exist")
    git_entry = _git_entry(project_path)
    if git_entry is not None and _known_toplevels.get(project_path) == git_entry:
        return project_path
    # One git process in the usual case (HEAD is a commit); the slower checks only name what is wrong.
    top_and_head = run_git_or_none(project_path, "rev-parse", "--show-toplevel", "--verify", "--quiet", "HEAD")
    if top_and_head is not None:
        toplevel = top_and_head.splitlines()[0]
        if toplevel == project_path and git_entry is not None:
            _known_toplevels[project_path] = git_entry
        return toplevel
    try:
        repo = run_git(project_path, "rev-parse", "--show-toplevel")
    except GitFailed as failed:
        if (refusal := unsafe_refusal(project_path, failed)) is not None:
            raise InvalidInputs(refusal) from None
        raise InvalidInputs(f"project path: {project_path} is not a git repository") from None
    if not run_git(repo, "for-each-ref", "--count=1", "--format=%(refname)", "refs/heads"):
        raise InvalidInputs(f"project path: {project_path} has no commits yet")
    return repo


_known_toplevels: dict[str, tuple[int, int]] = {}
"""Checkouts that git found to be their own top level with a commit, by their `.git` entry's
identity: a spawn asks three times (validate, plan, create), and while that entry is there, git
finds the checkout's top level in it. A repository made anew (`rm -rf .git; git init`) usually has
a new entry and is asked again; one that got the old inode back is still refused for lack of
commits by the checks that follow, which look for the refs they need."""


def _git_entry(directory: str) -> tuple[int, int] | None:
    try:
        entry = os.lstat(os.path.join(directory, ".git"))
    except OSError:
        return None
    return entry.st_dev, entry.st_ino


def require_existing_branch(repo: str, name: str) -> None:
    validate_branch_name(name)
    if not branch_exists(repo, name):
        raise InvalidInputs(f"branch.name: no branch {name!r} in {repo}")


def require_base(repo: str, base: str) -> str:
    validate_revision(base)
    if not is_commit(repo, base):
        raise InvalidInputs(f"branch.base: {base!r} is not a commit in {repo}")
    return base


def require_default_branch(repo: str) -> str:
    default = default_branch(repo)
    if default is None:
        raise InvalidInputs(f"branch: cannot determine the default branch of {repo}")
    return default


def default_branch(repo: str) -> str | None:
    """origin/HEAD's target, else local main, else master, else the checked-out branch."""
    refs = _default_branch_refs(repo)
    known = _known_default_branches.get(repo)
    if refs is not None and known is not None and known[0] == refs:
        return known[1]
    # One for-each-ref answers the first three; it skips a dangling origin/HEAD by itself.
    listed = run_git(repo, "for-each-ref", "--format=%(refname)%00%(symref)%00%(objecttype)", *DEFAULT_BRANCH_REFS)
    commits = {}
    for line in listed.splitlines():
        name, target, kind = line.split("\0")
        if kind == "commit":
            commits[name] = target
    found = None
    if commits.get("refs/remotes/origin/HEAD"):
        found = commits["refs/remotes/origin/HEAD"].removeprefix("refs/remotes/")
    else:
        found = next((name for name in ("main", "master") if f"refs/heads/{name}" in commits), None)
    if found is not None:
        if refs is not None and refs == _default_branch_refs(repo):  # none of them moved while git looked
            _known_default_branches[repo] = (refs, found)
        return found
    head = run_git_or_none(repo, "symbolic-ref", "--quiet", "HEAD")
    if head is not None and head.startswith("refs/heads/") and is_commit(repo, head):
        return head.removeprefix("refs/heads/")
    return None


_known_default_branches: dict[str, tuple[tuple[tuple[int, int, int] | None, ...], str]] = {}
"""Default branches that one of DEFAULT_BRANCH_REFS named, with the identity of the files those refs
were read from: a spawn asks twice (validate, then create), and only a change of those refs
changes the answer."""


def _default_branch_refs(repo: str) -> tuple[tuple[int, int, int] | None, ...] | None:
    """The identity (inode, change time, size, or absence) of every file DEFAULT_BRANCH_REFS can be
    read from: their loose files, the one origin/HEAD points to, and packed-refs. Git changes a
    ref by renaming a new file over its old one, or deletes it, so while these identities stay,
    the refs do. None where refs live elsewhere: a linked worktree or a submodule (a `.git`
    file), or the reftable format."""
    git_dir = os.path.join(repo, ".git")
    try:
        if not stat.S_ISDIR(os.lstat(git_dir).st_mode) or os.path.lexists(os.path.join(git_dir, "reftable")):
            return None
        paths = [os.path.join(git_dir, name) for name in ("packed-refs", *DEFAULT_BRANCH_REFS)]
        try:
            with open(os.path.join(git_dir, DEFAULT_BRANCH_REFS[0]), encoding="utf-8", errors="replace") as origin_head:
                pointed = origin_head.read().strip()
        except FileNotFoundError:
            pointed = ""
        if pointed.startswith("ref: refs/"):
            paths.append(os.path.join(git_dir, pointed.removeprefix("ref: ")))
        identities: list[tuple[int, int, int] | None] = []
        for path in paths:
            try:
                found = os.stat(path)
            except FileNotFoundError:
                identities.append(None)
                continue
            identities.append((found.st_ino, found.st_ctime_ns, found.st_size))
    except OSError:
        return None
    return tuple(identities)


def setup_hash_at(repo: str, commit: str) -> str | None:
    """The sha256 of `.bb-env-setup.sh` at `commit` (an object id the repository holds), None
    when it has none."""
    script = run_git_or_none(repo, "cat-file", "blob", f"{commit}:{SCRIPT_NAMES['setup']}")
    return None if script is None else hashlib.sha256(script.encode("utf-8", "surrogateescape")).hexdigest()
