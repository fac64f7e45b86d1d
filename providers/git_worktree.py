"""The `git-worktree` provider: one git worktree per thread under the provider's data dir.

Layout: `<data_dir>/worktrees/<path_key>/<repo-dir-name>`. An `existing` branch that is already
checked out in another worktree of the repo is adopted instead (`owns_path` False, kept on
removal); when a live environment of this provider works in that worktree, the thread joins it.
User text reaches git only after validation and behind `--` / `--end-of-options`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bb_environments.providers.branch_inputs import BranchChoice, ExistingBranch, NewBranch
from bb_environments.providers.contract import (
    READY,
    Availability,
    BaseHead,
    BindContext,
    CreateContext,
    Created,
    CreateResult,
    InvalidInputs,
    Leftover,
    Policy,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveFailed,
    RemoveResult,
    Requires,
    inputs_as,
    translate_errors,
)
from bb_environments.providers.git_commands import (
    NULL_OID,
    GitFailed,
    branch_exists,
    owe_post_checkout,
    run_git,
    run_git_or_none,
)
from bb_environments.providers.git_repository import (
    default_branch,
    require_base,
    require_default_branch,
    require_existing_branch,
    require_repo,
)
from bb_environments.providers.host.processes import command_lines, kill_and_wait
from bb_environments.providers.host.saved_work_limit import saved_work_max_bytes
from bb_environments.providers.refnames import validate_branch_name
from bb_environments.providers.saved_work import SavedWork, not_saved_notice, save_work, saved_notes_dir
from bb_environments.providers.workspace_files import (
    delete_tree,
    is_strictly_inside,
    remove_if_empty,
    require_path_key,
    stop_processes_in,
)
from bb_environments.providers.worktree_include import INCLUDE_FILE_NAME, copy_worktree_includes
from bb_environments.providers.worktree_pool import base_head, bind_member, delete_member_branch, member_branch
from bb_environments.providers.worktree_survey import (
    BRANCH_PREFIX,
    PROVIDER_ID,
    remove_worktree_leftover,
    worktree_leftovers,
)

TRANSCRIPT_PATH_LIMIT = 20
ADDING_LOCK_REASON = "initializing"
"""The lock reason `git worktree add` gives a worktree until its checkout has finished (in the C
locale, which run_git sets)."""


class DefaultBranch(BranchChoice, frozen=True, tag="default"):
    """A new branch `bb/<path key>` from the repo's default branch."""


class GitWorktreeInputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A `new` branch without `base` starts at the repository's default branch."""

    branch: DefaultBranch | ExistingBranch | NewBranch = DefaultBranch()


@dataclass(frozen=True)
class WorktreeEntry:
    path: str
    branch: str | None
    """Short branch name; None when detached or bare."""
    is_main: bool
    prunable: bool
    locked: str | None
    """The lock reason ("" for none given); None when not locked."""


@dataclass(frozen=True)
class _BranchPlan:
    branch: str
    start_point: str | None
    """Where a missing branch is created from; None when the branch must already exist."""
    merge_base_branch: str | None


class GitWorktreeProvider:
    id = PROVIDER_ID
    display_name = "Worktree"
    requires = Requires(git_checkout=True)
    policy = Policy(path_keys="per-thread", retire_grace_ms=300_000, pool=True)
    inputs_type = GitWorktreeInputs

    def availability(self, ctx: ProjectContext) -> Availability:
        if shutil.which("git") is None:
            return Availability("blocked", "git is not installed or not on PATH")
        return READY

    def validate(self, ctx: ProjectContext) -> None:
        repo = require_repo(ctx.project_path)
        branch = inputs_as(ctx, GitWorktreeInputs).branch
        if isinstance(branch, ExistingBranch):
            require_existing_branch(repo, branch.name)
            _adoptable_worktree(repo, list_worktrees(repo), branch.name, own_target=None)
        elif isinstance(branch, NewBranch):
            validate_branch_name(branch.name)
            if branch.base is None:
                require_default_branch(repo)
            else:
                require_base(repo, branch.base)
            if branch_exists(repo, branch.name):
                raise InvalidInputs(f"branch.name: branch {branch.name!r} already exists in {repo}")
        else:
            require_default_branch(repo)

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str | None:
        repo = require_repo(ctx.project_path)
        target = managed_worktree_path(ctx.data_dir, path_key, repo)
        branch = inputs_as(ctx, GitWorktreeInputs).branch
        if isinstance(branch, ExistingBranch):
            adopted = _adoptable_worktree(repo, list_worktrees(repo), branch.name, own_target=target)
            if adopted is not None:
                return adopted
        return str(target)

    def shares_planned_path(self, ctx: ProjectContext) -> bool:
        """An adopted worktree is used as it is, so a thread asking for its branch joins the
        environment already working there (another thread's worktree) instead of being refused."""
        branch = inputs_as(ctx, GitWorktreeInputs).branch
        if not isinstance(branch, ExistingBranch):
            return False
        repo = require_repo(ctx.project_path)
        return _adoptable_worktree(repo, list_worktrees(repo), branch.name, own_target=None) is not None

    def create(self, ctx: CreateContext) -> CreateResult:
        with translate_errors(GitFailed, ValueError) as failed:
            with _repository_lock(ctx.project_path):
                return self._create(ctx)
        return failed.create_failed()

    def _create(self, ctx: CreateContext) -> CreateResult:
        repo = require_repo(ctx.project_path)
        target = managed_worktree_path(ctx.data_dir, ctx.path_key, repo)
        branch = inputs_as(ctx, GitWorktreeInputs).branch
        if isinstance(branch, ExistingBranch):
            adopted = _adoptable_worktree(repo, list_worktrees(repo), branch.name, own_target=target)
            if adopted is not None:
                ctx.report.step(f"Using the worktree at {adopted}, which already has {branch.name}")
                return Created(
                    path=adopted, owns_path=False, merge_base_branch=default_branch(repo), resource={"adopted": True}
                )
        plan = _plan_branch(repo, branch, ctx.path_key)
        ctx.raise_if_cancelled()
        added = _added_afresh(ctx, repo, target, plan)
        if not added:
            worktrees = list_worktrees(repo)
            earlier = os.path.lexists(target) or _find_worktree(worktrees, target) is not None
            interrupted = earlier and _stop_interrupted_add(ctx, target)
            if interrupted or not _is_worktree_on_branch(worktrees, target, plan.branch):
                if earlier:
                    ctx.report.step("Removing the worktree an earlier attempt left behind")
                    stop_processes_in(target, ctx.report, "worktree")
                    _remove_worktree(repo, target)
                    ctx.raise_if_cancelled()
                ctx.report.step("Creating worktree")
                _add_worktree(repo, target, plan)
                added = True
                ctx.report.log(f"Created worktree at {target} on branch {plan.branch}")
        if added:
            owe_post_checkout(str(target), ctx.environment_id, NULL_OID)  # git's own for a new worktree
        ctx.raise_if_cancelled()
        _copy_includes(ctx, repo, target)
        ctx.raise_if_cancelled()
        return Created(
            path=str(target), owns_path=True, merge_base_branch=plan.merge_base_branch, resource={"branch": plan.branch}
        )

    # -- warm pools (SPEC 10): providers/worktree_pool.py ---------------------------------------

    def base_head(self, ctx: ProjectContext) -> BaseHead:
        return base_head(require_repo(ctx.project_path), inputs_as(ctx, GitWorktreeInputs).branch)

    def member_inputs(self, ctx: ProjectContext, path_key: str) -> GitWorktreeInputs:
        branch = inputs_as(ctx, GitWorktreeInputs).branch
        return GitWorktreeInputs(branch if isinstance(branch, DefaultBranch) else member_branch(branch, path_key))

    def bind(self, ctx: BindContext) -> dict[str, Any] | None:
        branch = inputs_as(ctx, GitWorktreeInputs).branch
        with _repository_lock(ctx.project_path):
            return bind_member(require_repo(ctx.project_path), branch, ctx)

    def remove(self, ctx: RemoveContext) -> RemoveResult:
        if (ctx.resource or {}).get("adopted") is True:
            return Removed()
        with translate_errors(OSError, ValueError) as failed:
            root = worktrees_root(ctx.data_dir)
            key_dir = root / require_path_key(ctx.path_key)
            paths = [Path(ctx.path)] if ctx.path is not None else _entries(key_dir)
            saved = SavedWork(None)
            for path in paths:
                ctx.raise_if_cancelled()
                if not is_strictly_inside(path, root):
                    return RemoveFailed(f"refusing to remove {path}: it is not inside {root}")
                ctx.report.step(f"Removing worktree {path}")
                stop_processes_in(path, ctx.report, "worktree")
                with _repository_lock(ctx.project_path):
                    if ctx.path is not None and not ctx.unbound_member:
                        saved = _save_work(ctx, path)
                    _remove_worktree(ctx.project_path, path)
                    if ctx.unbound_member:
                        delete_member_branch(ctx.project_path, ctx.resource)
            remove_if_empty(key_dir)
            return Removed(saved.ref, saved.not_saved)
        return failed.remove_failed()

    def leftovers(self, data_dir: str, repos: list[str]) -> list[Leftover]:
        return worktree_leftovers(worktrees_root(data_dir), repos, list_worktrees)

    def remove_leftover(self, data_dir: str, leftover: Leftover) -> str | None:
        with _repository_lock(leftover.repo):
            return remove_worktree_leftover(Path(data_dir), worktrees_root(data_dir), leftover, _remove_worktree)


def _save_work(ctx: RemoveContext, path: Path) -> SavedWork:
    """Save what exists only in the worktree, after its processes stopped (nothing writes to it
    any more); a failure keeps the worktree, for the removal's retry. Only a worktree that create
    returned is saved: one that a failed create left was never handed to a thread."""
    if ctx.project_path is None:
        raise WorkNotSaved(f"cannot save the work in {path}: the environment names no project")
    max_file_bytes = saved_work_max_bytes()
    try:
        saved = save_work(
            ctx.project_path, path, ctx.environment_id, saved_notes_dir(Path(ctx.data_dir)), max_file_bytes
        )
    except GitFailed as error:
        raise WorkNotSaved(f"the work in {path} could not be saved, so it is kept: {error}") from None
    if saved.ref is not None:
        ctx.report.log(f"Saved the work that was only in the worktree as {saved.ref}")
    if saved.not_saved:
        ctx.report.log(not_saved_notice(saved, max_file_bytes, path))
    return saved


class WorkNotSaved(ValueError):
    """The worktree's work could not be saved, so the removal stops before deleting anything."""


_repository_locks: dict[str, threading.RLock] = {}
_repository_locks_guard = threading.Lock()


def _repository_lock(project_path: str | None) -> threading.RLock:
    """One worktree change at a time per repository in this process: git reads every worktree's
    admin dir while it adds one, and fails ("failed to read .git/worktrees/<x>/commondir") on one
    that a concurrent `worktree add` has created but not yet filled, as twenty threads spawned
    at once showed."""
    key = os.path.realpath(project_path) if project_path else ""
    with _repository_locks_guard:
        return _repository_locks.setdefault(key, threading.RLock())


def worktrees_root(data_dir: str) -> Path:
    return Path(os.path.abspath(data_dir)) / "worktrees"


def managed_worktree_path(data_dir: str, path_key: str, repo: str) -> Path:
    return worktrees_root(data_dir) / require_path_key(path_key) / repo_dir_name(repo)


def repo_dir_name(repo: str) -> str:
    """The repo directory's basename reduced to `[A-Za-z0-9._-]`, never hidden nor option-like."""
    sanitized = re.sub(r"[^A-Za-z0-9._-]", "-", os.path.basename(os.path.normpath(repo)))
    return sanitized.lstrip(".-") or "repo"


def list_worktrees(repo: str) -> list[WorktreeEntry]:
    output = run_git(repo, "worktree", "list", "--porcelain", "-z")
    entries: list[WorktreeEntry] = []
    for record in output.split("\0\0"):
        fields = [field for field in record.split("\0") if field]
        if not fields:
            continue
        values = dict(field.partition(" ")[::2] for field in fields)
        branch_ref = values.get("branch")
        entries.append(
            WorktreeEntry(
                path=values["worktree"],
                branch=branch_ref.removeprefix("refs/heads/") if branch_ref else None,
                is_main=not entries,
                prunable="prunable" in values,
                locked=values.get("locked"),
            )
        )
    return entries


def _plan_branch(repo: str, branch: DefaultBranch | ExistingBranch | NewBranch, path_key: str) -> _BranchPlan:
    if isinstance(branch, ExistingBranch):
        require_existing_branch(repo, branch.name)
        return _BranchPlan(branch.name, None, default_branch(repo))
    if isinstance(branch, NewBranch):
        validate_branch_name(branch.name)
        base = require_base(repo, branch.base) if branch.base else require_default_branch(repo)
        return _BranchPlan(branch.name, base, base)
    base = require_default_branch(repo)
    return _BranchPlan(BRANCH_PREFIX + path_key, base, base)


def _adoptable_worktree(repo: str, worktrees: list[WorktreeEntry], branch: str, own_target: Path | None) -> str | None:
    """The other worktree that already has `branch` checked out, to adopt instead of creating one."""
    for entry in worktrees:
        if entry.branch != branch:
            continue
        if entry.is_main or _same_path(entry.path, repo):
            raise InvalidInputs(
                f"branch.name: branch {branch!r} is checked out in the project checkout; "
                "use project-checkout or another branch"
            )
        if own_target is not None and _same_path(entry.path, own_target):
            return None
        if entry.prunable:
            raise InvalidInputs(
                f"branch.name: branch {branch!r} is checked out at {entry.path}, which no longer "
                "exists; run `git worktree prune` first"
            )
        return entry.path
    return None


def _find_worktree(worktrees: list[WorktreeEntry], path: Path) -> WorktreeEntry | None:
    return next((entry for entry in worktrees if _same_path(entry.path, path)), None)


def _is_worktree_on_branch(worktrees: list[WorktreeEntry], target: Path, branch: str) -> bool:
    entry = _find_worktree(worktrees, target)
    return (
        entry is not None
        and entry.branch == branch
        and not entry.prunable
        and entry.locked != ADDING_LOCK_REASON
        and os.path.exists(target / ".git")
    )


def _stop_interrupted_add(ctx: CreateContext, target: Path) -> bool:
    """End a `git worktree add` of `target` that an earlier attempt started; whether there was one.

    A service killed during the checkout leaves its git running: once the checkout ends, it writes
    to the dead service's pipe, dies of SIGPIPE, and git deletes the worktree it was making, after
    this attempt took it for done (it is on its branch already) or while this attempt adds it anew.
    SIGKILL leaves git no clean-up to do: the half-made worktree stays, for this attempt to remove
    and add again."""
    adding = [pid for pid, arguments in command_lines() if _is_worktree_add_of(arguments, target)]
    if not adding:
        return False
    if not kill_and_wait(adding):
        raise GitFailed(f"the `git worktree add` an earlier attempt left at {target} would not end", transient=True)
    ctx.report.log("Stopped the `git worktree add` an earlier attempt left running")
    return True


def _is_worktree_add_of(arguments: list[str], target: Path) -> bool:
    """Whether argv is git's `[options] worktree add [options] <target> [branch]`: each word whole,
    so that a path that merely contains `target` does not match."""
    return (
        os.path.basename(arguments[0]) == "git"
        and str(target) in arguments
        and any(word == "worktree" and following == "add" for word, following in zip(arguments, arguments[1:]))
    )


def _added_afresh(ctx: CreateContext, repo: str, target: Path, plan: _BranchPlan) -> bool:
    """The usual first attempt, in one git process instead of three: nothing at the target, the
    branch made by `worktree add -b`. Whatever an earlier attempt left (its branch, its worktree, a
    registration without its directory) makes git refuse, having made the branch at most, and the
    caller then looks at the repository's worktrees and branches and takes it from there."""
    if plan.start_point is None or os.path.lexists(target):
        return False
    ctx.report.step("Creating worktree")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        _new_branch_worktree(repo, target, plan.branch, plan.start_point)
    except GitFailed:
        return False
    ctx.report.log(f"Created worktree at {target} on branch {plan.branch}")
    return True


def _add_worktree(repo: str, target: Path, plan: _BranchPlan) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if branch_exists(repo, plan.branch):
        # Reuse as is (a re-run after a crash, or an existing branch); never reset a branch.
        run_git(repo, "worktree", "add", "--", str(target), plan.branch)
        return
    if plan.start_point is None:
        raise InvalidInputs(f"branch.name: no branch {plan.branch!r} in {repo}")  # deleted meanwhile
    _new_branch_worktree(repo, target, plan.branch, plan.start_point)


def _new_branch_worktree(repo: str, target: Path, branch: str, start_point: str) -> None:
    # --no-track: the thread's branch must not push to (or pull from) its base.
    run_git(repo, "worktree", "add", "--no-track", "-b", branch, "--", str(target), start_point)


def _remove_worktree(repo: str | None, path: Path) -> None:
    """Unregister and delete a worktree directory; git failures are tolerated, leftovers deleted."""
    repo_dir = repo if repo is not None and os.path.isdir(repo) else None
    if repo_dir is not None:
        # Twice --force: also removes a locked worktree, which is ours to remove.
        run_git_or_none(repo_dir, "worktree", "remove", "--force", "--force", "--", str(path))
    if os.path.lexists(path):
        delete_tree(path)
    if repo_dir is not None:
        _unregister_worktree(repo_dir, path)


def _unregister_worktree(repo: str, path: Path) -> None:
    """Drop git's record of the worktree at `path` if `worktree remove` left it behind.

    Not `git worktree prune`: that sweeps every worktree whose directory is missing at that
    instant, including one that the user's own `git worktree add` is creating right then.
    """
    common = run_git_or_none(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    if not common:
        return
    for admin in Path(common.strip(), "worktrees").glob("*"):
        try:
            recorded = Path((admin / "gitdir").read_text().strip()).parent
        except OSError:
            continue
        if _same_path(recorded, path):
            delete_tree(admin)


def _copy_includes(ctx: CreateContext, repo: str, target: Path) -> None:
    if not os.path.lexists(os.path.join(repo, INCLUDE_FILE_NAME)):
        return
    ctx.report.step("Copying .worktreeinclude files")
    report = copy_worktree_includes(Path(repo), target, ctx.cancelled)
    if report.error is not None:
        ctx.report.log(f"Skipped .worktreeinclude: {report.error}")
    for line in _summarize("Copied", report.copied):
        ctx.report.log(line)
    for line in _summarize("Skipped", [f"{path} ({reason})" for path, reason in report.skipped]):
        ctx.report.log(line)


def _summarize(verb: str, items: list[str]) -> list[str]:
    if not items:
        return []
    lines = [f"{verb} {len(items)} file(s):", *items[:TRANSCRIPT_PATH_LIMIT]]
    if len(items) > TRANSCRIPT_PATH_LIMIT:
        lines.append(f"and {len(items) - TRANSCRIPT_PATH_LIMIT} more")
    return lines


def _entries(directory: Path) -> list[Path]:
    return sorted(directory.iterdir()) if directory.is_dir() else []


def _same_path(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
