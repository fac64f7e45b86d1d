"""A provider for tests that waits at gates, so a test can crash the service mid-create or mid-remove.

Every call is appended to `<data_dir>/calls.log`. `create` waits until `<data_dir>/gates/create`
exists, `remove` until `<data_dir>/gates/remove` exists (tests usually open them at the start).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bb_environments.providers.contract import (
    READY,
    Availability,
    CreateContext,
    Created,
    CreateFailed,
    CreateResult,
    Policy,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveResult,
    Requires,
)


def gate(data_dir: str | Path, name: str) -> Path:
    return Path(data_dir) / "gates" / name


def calls(data_dir: str | Path) -> list[str]:
    log = Path(data_dir) / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


class GatedProvider:
    id = "gated"
    display_name = "Gated (tests)"
    requires = Requires()
    policy = Policy(path_keys="per-thread", retire_grace_ms=0)
    inputs_type = None

    def availability(self, ctx: ProjectContext) -> Availability:
        return READY

    def validate(self, ctx: ProjectContext) -> None:
        pass

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str:
        return str(Path(ctx.data_dir) / "workspaces" / path_key)

    def create(self, ctx: CreateContext) -> CreateResult:
        _record(ctx.data_dir, f"create {ctx.path_key} {ctx.attempt}")
        if not _wait_for(gate(ctx.data_dir, "create"), ctx.cancelled):
            return CreateFailed("terminal", "cancelled")
        path = Path(self.planned_path(ctx, ctx.path_key))
        path.mkdir(parents=True, exist_ok=True)
        project = Path(ctx.project_path) if ctx.project_path else None
        for hook in (".bb-env-setup.sh", ".bb-env-teardown.sh"):
            if project and (project / hook).exists():
                shutil.copy(project / hook, path / hook)
        return Created(path=str(path), owns_path=True)

    def remove(self, ctx: RemoveContext) -> RemoveResult:
        _record(ctx.data_dir, f"remove {ctx.path_key} {ctx.attempt} {ctx.path}")
        _wait_for(gate(ctx.data_dir, "remove"), ctx.cancelled)
        shutil.rmtree(Path(ctx.data_dir) / "workspaces" / ctx.path_key, ignore_errors=True)
        return Removed()


def _record(data_dir: str, line: str) -> None:
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(data_dir) / "calls.log", "a") as log:
        log.write(line + "\n")


def _wait_for(path: Path, cancelled) -> bool:
    """Hold the call until the test opens the gate (another process, so a file); a cancel ends it at once."""
    while not path.exists():
        if cancelled.wait(0.01):
            return False
    return True


class FlakyProvider(GatedProvider):
    """Fails its first creates (`<data_dir>/failures` holds "transient N" or "terminal N"), then works.

    Its path keys are per attempt, so every retry claims a new path.
    """

    id = "flaky"
    display_name = "Flaky (tests)"
    policy = Policy(path_keys="per-attempt", retire_grace_ms=0)

    def create(self, ctx: CreateContext) -> CreateResult:
        plan = Path(ctx.data_dir) / "failures"
        kind, left = plan.read_text().split() if plan.exists() else ("transient", "0")
        if int(left) > 0:
            plan.write_text(f"{kind} {int(left) - 1}")
            _record(ctx.data_dir, f"create {ctx.path_key} {ctx.attempt} failed")
            (Path(self.planned_path(ctx, ctx.path_key))).mkdir(parents=True, exist_ok=True)  # a leftover
            return CreateFailed(kind, f"{kind} failure, {left} left")
        return super().create(ctx)


class PausableProvider(GatedProvider):
    """Suspends its environments 0.3 s after their last activity, like a cloud sandbox would."""

    id = "pausable"
    display_name = "Pausable (tests)"

    def create(self, ctx: CreateContext) -> CreateResult:
        created = super().create(ctx)
        if not isinstance(created, Created):
            return created
        return Created(path=created.path, owns_path=True, resource={"dataDir": ctx.data_dir, "snapshot": 0})

    def idle_pause_due(self, last_activity, now, data_dir: str) -> bool:
        return (now - last_activity).total_seconds() > 0.3

    def pause(self, resource, checkpoint):
        snapshot = resource["snapshot"] + 1
        checkpoint({**resource, "snapshot": snapshot, "running": True})
        _record(resource["dataDir"], f"pause {snapshot}")
        return {**resource, "snapshot": snapshot, "running": False}

    def resume(self, resource):
        _record(resource["dataDir"], f"resume from {resource['snapshot']}")
        return {**resource, "running": True}


class CloudPausableProvider(PausableProvider):
    """A PausableProvider whose environments live in no host's filesystem: the core runs it, as it
    runs Modal's, under its own data dir."""

    id = "cloud-pausable"
    display_name = "Cloud pausable (tests)"
    in_the_cloud = True
