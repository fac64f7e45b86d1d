"""The `personal-workspace` provider: a plain directory per thread for threads without a project.

Layout: `<data_dir>/workspaces/<path_key>`. The directory is owned (`owns_path` True): removal
stops the processes still running in it and deletes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from bb_environments.providers.contract import (
    READY,
    Availability,
    CreateContext,
    Created,
    CreateResult,
    Leftover,
    Policy,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveFailed,
    RemoveResult,
    Requires,
    SilentReporter,
    translate_errors,
)
from bb_environments.providers.workspace_files import (
    delete_tree,
    is_strictly_inside,
    require_path_key,
    stop_processes_in,
)


class PersonalWorkspaceProvider:
    id = "personal-workspace"
    display_name = "Personal workspace"
    requires = Requires(projectless=True)
    policy = Policy(path_keys="per-thread", retire_grace_ms=300_000, children="share")
    inputs_type = None

    def availability(self, ctx: ProjectContext) -> Availability:
        return READY

    def validate(self, ctx: ProjectContext) -> None:
        """No inputs to check; the path key is checked where it is used."""

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str | None:
        return str(workspace_path(ctx.data_dir, path_key))

    def create(self, ctx: CreateContext) -> CreateResult:
        with translate_errors(OSError, ValueError) as failed:
            path = workspace_path(ctx.data_dir, ctx.path_key)
            ctx.report.step("Preparing personal workspace")
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                # An earlier attempt's (cut short by a crash) or someone else's: it may hold a setup
                # script. Asked again so that a file there is a failure; a directory gone meanwhile
                # is made again, and not said to be empty all the same.
                path.mkdir(parents=True, exist_ok=True)
                return Created(path=str(path), owns_path=True)
            return Created(path=str(path), owns_path=True, empty=True)
        return failed.create_failed()

    def remove(self, ctx: RemoveContext) -> RemoveResult:
        with translate_errors(OSError, ValueError) as failed:
            root = workspaces_root(ctx.data_dir)
            path = Path(ctx.path) if ctx.path is not None else root / require_path_key(ctx.path_key)
            if not is_strictly_inside(path, root):
                return RemoveFailed(f"refusing to remove {path}: it is outside the personal workspace root")
            if not os.path.lexists(path):
                return Removed()
            ctx.raise_if_cancelled()
            ctx.report.step(f"Removing personal workspace {path}")
            stop_processes_in(path, ctx.report, "workspace")
            delete_tree(path)
            return Removed()
        return failed.remove_failed()

    def leftovers(self, data_dir: str, repos: list[str]) -> list[Leftover]:
        """Every directory under the root: a thread's workspace is the whole of one."""
        root = workspaces_root(data_dir)
        try:
            entries = sorted(entry for entry in root.iterdir() if entry.is_dir() and not entry.is_symlink())
        except FileNotFoundError:
            return []
        return [Leftover(self.id, "workspace", os.path.realpath(entry), path_key=entry.name) for entry in entries]

    def remove_leftover(self, data_dir: str, leftover: Leftover) -> str | None:
        """Deleted as a removal deletes it: a plain directory has no history to save its work in."""
        path = Path(leftover.path)
        if not is_strictly_inside(path, workspaces_root(data_dir)):
            raise ValueError(f"refusing to remove {path}: it is outside the personal workspace root")
        if os.path.lexists(path):
            stop_processes_in(path, SilentReporter(), "workspace")
            delete_tree(path)
        return None


def workspaces_root(data_dir: str) -> Path:
    return Path(os.path.abspath(data_dir)) / "workspaces"


def workspace_path(data_dir: str, path_key: str) -> Path:
    return workspaces_root(data_dir) / require_path_key(path_key)
