"""What the `git-worktree` provider does for a warm pool (SPEC 10): read where a member would be
prepared now, name a member's branch, and rename it to its thread's when the member is bound.

User text reaches git only after validation and behind `--` / `--end-of-options`.
"""

from __future__ import annotations

from typing import Any

from bb_environments.providers.branch_inputs import BranchChoice, ExistingBranch, NewBranch
from bb_environments.providers.contract import BaseHead, BindContext, BindFailed, InvalidInputs
from bb_environments.providers.git_commands import GitFailed, run_git, run_git_or_none
from bb_environments.providers.git_repository import require_base, require_default_branch, setup_hash_at
from bb_environments.providers.refnames import validate_branch_name
from bb_environments.providers.workspace_files import require_path_key
from bb_environments.providers.worktree_survey import BRANCH_PREFIX


def base_head(repo: str, branch: BranchChoice) -> BaseHead:
    """The commit a member would start from now (a new branch's base, else the default branch)
    and the sha256 of `.bb-env-setup.sh` there."""
    base = require_base(repo, branch.base) if isinstance(branch, NewBranch) and branch.base else None
    commit = run_git(
        repo, "rev-parse", "--verify", "--end-of-options", f"{base or require_default_branch(repo)}^{{commit}}"
    )
    return BaseHead(commit.strip(), setup_hash_at(repo, commit.strip()))


def member_branch(branch: ExistingBranch | NewBranch, path_key: str) -> NewBranch:
    """A member's new branch: named `bb/<the member's path key>`, as a default branch's is."""
    if isinstance(branch, ExistingBranch):
        raise InvalidInputs("branch.kind: a pool prepares new branches; an `existing` branch cannot be pooled")
    return NewBranch(name=BRANCH_PREFIX + path_key, base=branch.base)


def bind_member(repo: str, branch: BranchChoice, ctx: BindContext) -> dict[str, Any] | None:
    """Rename the member's branch to the thread's: its new branch's name, or `bb/<path key>`.
    Done already (a repeat after a crash) when the worktree is on that branch."""
    if isinstance(branch, ExistingBranch):
        raise BindFailed("a pool's member cannot take an existing branch")
    target = branch.name if isinstance(branch, NewBranch) else BRANCH_PREFIX + require_path_key(ctx.path_key)
    try:
        validate_branch_name(target)
    except InvalidInputs as refused:
        raise BindFailed(str(refused)) from None
    current = run_git_or_none(ctx.path, "symbolic-ref", "--quiet", "--short", "HEAD")
    if current is None:
        raise BindFailed(f"the member's worktree {ctx.path} is on no branch")
    if current.strip() != target:
        try:
            run_git(repo, "branch", "-m", "--", current.strip(), target)
        except GitFailed as failed:
            raise BindFailed(str(failed)) from None
    return {**(ctx.resource or {}), "branch": target}


def delete_member_branch(repo: str | None, resource: dict[str, Any] | None) -> None:
    """The branch of a member no thread took, once its worktree is removed: only `bb/` branches
    (the member's own), and never one checked out elsewhere (git refuses that)."""
    branch = (resource or {}).get("branch")
    if repo is not None and isinstance(branch, str) and branch.startswith(BRANCH_PREFIX):
        run_git_or_none(repo, "branch", "-D", "--", branch)
