"""The `project-checkout` provider: the thread runs in the project checkout itself.

Nothing is created or deleted (`owns_path` False); at most the checkout's branch is switched, and
only when the switch cannot lose or tangle work: HEAD on a branch, no conflicts, no operation in
progress, no uncommitted changes. Threads that keep the current branch share one environment per
directory; a switch is refused while another environment holds the directory. Switches of one checkout are serialized by a file lock so two
processes sharing the data dir cannot interleave them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Annotated

import msgspec

from bb_environments.providers.branch_inputs import BranchChoice, ExistingBranch, NewBranch
from bb_environments.providers.contract import (
    READY,
    Availability,
    CreateContext,
    Created,
    CreateResult,
    InvalidInputs,
    Policy,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveResult,
    Requires,
    inputs_as,
    translate_errors,
)
from bb_environments.providers.git_commands import (
    GitFailed,
    branch_exists,
    is_commit,
    owe_post_checkout,
    run_git,
    run_git_or_none,
    unsafe_refusal,
)
from bb_environments.providers.refnames import validate_branch_name, validate_revision

LOCK_POLL_SECONDS = 0.05
# Marker in the git dir → the operation it means; HEAD may be detached while one runs.
IN_PROGRESS_MARKERS = (
    ("MERGE_HEAD", "merge"),
    ("rebase-merge", "rebase"),
    ("rebase-apply", "rebase"),
    ("CHERRY_PICK_HEAD", "cherry-pick"),
    ("REVERT_HEAD", "revert"),
    ("BISECT_LOG", "bisect"),
)


class CurrentBranch(BranchChoice, frozen=True, tag="current"):
    """Run on whatever the checkout has now; never switches, works in any directory."""


CheckoutBranch = CurrentBranch | ExistingBranch | NewBranch
"""A `new` branch without `base` starts at the checkout's current HEAD."""


class ProjectCheckoutInputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    branch: CheckoutBranch = CurrentBranch()
    path: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """A directory inside the project to run in: relative to the project root, or absolute."""


class ProjectCheckoutProvider:
    id = "project-checkout"
    display_name = "Project checkout"
    requires = Requires(project_checkout=True)
    policy = Policy(path_keys="per-thread", retire_grace_ms=None)
    inputs_type = ProjectCheckoutInputs

    def availability(self, ctx: ProjectContext) -> Availability:
        return READY

    def validate(self, ctx: ProjectContext) -> None:
        directory = run_directory(ctx)
        branch = inputs_as(ctx, ProjectCheckoutInputs).branch
        if not isinstance(branch, CurrentBranch):
            _needs_switch(_require_checkout(directory), branch)

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str | None:
        return run_directory(ctx)

    def shares_planned_path(self, ctx: ProjectContext) -> bool:
        """A thread that leaves the branch as it is joins whoever already runs in the directory."""
        return isinstance(inputs_as(ctx, ProjectCheckoutInputs).branch, CurrentBranch)

    def create(self, ctx: CreateContext) -> CreateResult:
        with translate_errors(GitFailed, ValueError) as failed:
            return self._create(ctx)
        return failed.create_failed()

    def _create(self, ctx: CreateContext) -> CreateResult:
        directory = run_directory(ctx)
        branch = inputs_as(ctx, ProjectCheckoutInputs).branch
        if isinstance(branch, CurrentBranch):
            current = _current_branch_if_any(directory)
            return Created(path=directory, owns_path=False, merge_base_branch=current, resource={"branch": current})
        checkout = _require_checkout(directory)
        with _checkout_lock(ctx, checkout):
            # Validation ran earlier; the checkout may have changed since.
            switched_from = _current_branch(checkout)
            if _needs_switch(checkout, branch):
                ctx.raise_if_cancelled()
                _remember_switched_from(checkout, branch.name, switched_from, ctx.path_key)
                try:
                    _switch(ctx, checkout, branch)
                except Exception:
                    _forget_switched_from(checkout, branch.name)  # no switch: nothing for a rerun to know
                    raise
            else:
                ctx.report.step(f"Already on branch {branch.name}")
                switched_from = _remembered_switched_from(checkout, branch.name, ctx.path_key) or switched_from
        base = branch.base if isinstance(branch, NewBranch) else None
        return Created(
            path=directory, owns_path=False, merge_base_branch=base or switched_from, resource={"branch": branch.name}
        )

    def remove(self, ctx: RemoveContext) -> RemoveResult:
        return Removed()


def run_directory(ctx: ProjectContext) -> str:
    """The real path the thread runs in: the project root, or `inputs.path` inside it."""
    project = _require_project(ctx.project_path)
    requested = inputs_as(ctx, ProjectCheckoutInputs).path
    if requested is None:
        return project
    if "\0" in requested:
        raise InvalidInputs("path: must not contain a NUL character")
    directory = os.path.realpath(os.path.join(project, requested))
    if directory != project and Path(project) not in Path(directory).parents:
        raise InvalidInputs(f"path: {requested!r} is outside the project")
    if not os.path.isdir(directory):
        raise InvalidInputs(f"path: {requested!r} is not a directory in the project")
    return directory


def _require_project(project_path: str | None) -> str:
    if project_path is None:
        raise InvalidInputs("project path: a project checkout is required")
    if not os.path.isdir(project_path):
        raise InvalidInputs(f"project path: {project_path} does not exist")
    return os.path.realpath(project_path)


def _require_checkout(directory: str) -> str:
    """The real top-level directory of the git checkout holding `directory`."""
    if shutil.which("git") is None:
        raise InvalidInputs("branch: switching branches needs git, which is not on PATH")
    try:
        top_level = run_git(directory, "rev-parse", "--show-toplevel")
    except GitFailed as failed:
        if (refusal := unsafe_refusal(directory, failed)) is not None:
            raise InvalidInputs(refusal) from None
        raise InvalidInputs(f"branch: {directory} is not a git checkout, so only kind 'current' is possible") from None
    return os.path.realpath(top_level)


def _needs_switch(checkout: str, branch: ExistingBranch | NewBranch) -> bool:
    """False when the checkout is already on `branch`; raise InvalidInputs when it cannot switch."""
    validate_branch_name(branch.name)
    if isinstance(branch, NewBranch) and branch.base is not None:
        validate_revision(branch.base)
    current = _current_branch(checkout)
    if current == branch.name:
        return False
    blocker = _switch_blocker(checkout, current)
    if blocker is not None:
        raise InvalidInputs(blocker)
    if isinstance(branch, ExistingBranch):
        if not branch_exists(checkout, branch.name):
            raise InvalidInputs(f"branch.name: no branch {branch.name!r}")
        return True
    if branch_exists(checkout, branch.name):
        raise InvalidInputs(f"branch.name: branch {branch.name!r} already exists")
    if branch.base is not None and not is_commit(checkout, branch.base):
        raise InvalidInputs(f"branch.base: {branch.base!r} is not a commit")
    return True


def _switch_blocker(checkout: str, current_branch: str | None) -> str | None:
    """Why switching branches now could lose or tangle work, or None when it is safe."""
    operation = _operation_in_progress(checkout)
    if operation is None and current_branch is None:
        return "Checkout blocked while HEAD is detached"
    if not is_commit(checkout, "HEAD"):
        return "Checkout blocked before the first commit"
    if run_git(checkout, "ls-files", "--unmerged"):
        return "Checkout blocked by unresolved conflicts"
    if operation is not None:
        return f"Checkout blocked by an in-progress {operation}"
    if run_git(checkout, "status", "--porcelain", "--untracked-files=no"):
        return "Checkout blocked by uncommitted changes"
    return None


def _operation_in_progress(checkout: str) -> str | None:
    git_dir = Path(run_git(checkout, "rev-parse", "--absolute-git-dir"))
    return next((name for marker, name in IN_PROGRESS_MARKERS if (git_dir / marker).exists()), None)


def _current_branch(checkout: str) -> str | None:
    """The checked-out branch (possibly still without commits); None when HEAD is detached."""
    head = run_git_or_none(checkout, "symbolic-ref", "--quiet", "HEAD")
    return head.removeprefix("refs/heads/") if head is not None else None


def _current_branch_if_any(directory: str) -> str | None:
    """The branch of the checkout holding `directory`; None outside git or without git installed."""
    return _current_branch(directory) if shutil.which("git") is not None else None


def _switch(ctx: CreateContext, checkout: str, branch: ExistingBranch | NewBranch) -> None:
    previous_head = run_git(checkout, "rev-parse", "--verify", "HEAD")
    if isinstance(branch, ExistingBranch):
        ctx.report.step(f"Switching to branch {branch.name}")
        run_git(checkout, "switch", "--no-guess", "--end-of-options", branch.name)
        ctx.report.log(f"Switched to branch {branch.name}")
    else:
        base = branch.base or "HEAD"
        ctx.report.step(f"Creating branch {branch.name} from {base}")
        # --no-track: the thread's branch must not push to (or pull from) its base.
        run_git(checkout, "switch", "--no-track", "--create", branch.name, "--end-of-options", base)
        ctx.report.log(f"Switched to new branch {branch.name}")
    owe_post_checkout(checkout, ctx.environment_id, previous_head)


def _remember_switched_from(checkout: str, branch_name: str, switched_from: str | None, path_key: str) -> None:
    """Note in the repository's config, before switching, which branch this environment leaves.

    A create killed after the switch but before Created was recorded runs again on the switched
    checkout; only this note still knows the branch the work left. Git deletes it with the branch.
    """
    if switched_from is None:
        return  # a switch needs HEAD on a branch (`_switch_blocker`)
    section = f"branch.{branch_name}"
    # Read back only when no switch is needed, so only after both writes and the switch.
    run_git(checkout, "config", "--end-of-options", f"{section}.bbSwitchedFrom", switched_from)
    run_git(checkout, "config", "--end-of-options", f"{section}.bbSwitchedFor", path_key)


def _forget_switched_from(checkout: str, branch_name: str) -> None:
    for key in ("bbSwitchedFrom", "bbSwitchedFor"):
        run_git_or_none(checkout, "config", "--unset", "--end-of-options", f"branch.{branch_name}.{key}")


def _remembered_switched_from(checkout: str, branch_name: str, path_key: str) -> str | None:
    """The branch an earlier run of this environment's create left, or None when none noted it."""
    section = f"branch.{branch_name}"
    if run_git_or_none(checkout, "config", "--get", "--end-of-options", f"{section}.bbSwitchedFor") != path_key:
        return None  # another environment switched here, or the user did
    return run_git_or_none(checkout, "config", "--get", "--end-of-options", f"{section}.bbSwitchedFrom")


@contextmanager
def _checkout_lock(ctx: CreateContext, checkout: str) -> Iterator[None]:
    """Hold an exclusive flock for `checkout`; waits while another switch runs, stops on cancel."""
    lock_directory = Path(ctx.data_dir) / "locks"
    lock_directory.mkdir(parents=True, exist_ok=True)
    lock_path = lock_directory / f"{hashlib.sha256(checkout.encode()).hexdigest()}.lock"
    with open(lock_path, "a") as lock_file:  # closing the file releases the lock
        if not _try_lock(lock_file):
            ctx.report.step("Waiting for another branch switch in this checkout to finish")
            while not _try_lock(lock_file):
                ctx.cancelled.wait(LOCK_POLL_SECONDS)
                ctx.raise_if_cancelled()
        yield


def _try_lock(lock_file: IO[str]) -> bool:
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
