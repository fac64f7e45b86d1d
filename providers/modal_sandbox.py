"""The `modal-sandbox` provider: one Modal sandbox per environment, the project cloned inside.

Image: built from the provider's Dockerfile (see `providers.modal_settings`) and published as
`bb-standard:<sha256 of the Dockerfile text>`; looked up by that name first, built only when
missing, shared by every sandbox and never removed with one.

Create: the sandbox is tagged `bb-path-key=<path key>` in the same call that creates it, so a
create interrupted in flight (Modal commits the sandbox before `Sandbox.create` returns) is found
again by tag: a re-run create reuses it, remove terminates it. Inside, the project is cloned from
its `origin` remote and `.bb-env-setup.sh` run (the scripts in `providers.modal_scripts`); both
steps are idempotent inside the sandbox (a lock plus a finished-marker), so a re-run create never
clones or sets up twice. Credentials for private remotes are out of scope: only what the origin
URL itself carries reaches the sandbox, and that URL travels on the process's stdin, never in
argv, transcript or resource.

Warm pools (`providers.modal_pool`): a member is a sandbox created, cloned and set up ahead; its
binding tags it `bb-bound-to=<the thread's path key>`.

Pause snapshots the filesystem, hands the snapshot id to `checkpoint`, then terminates; resume
starts a sandbox from the snapshot with the same tags and skips setup. Superseded snapshots are
deleted once a later resume or the removal can be sure the core recorded their successor.

Every call into Modal goes through `providers.modal_sdk`, which turns Modal's errors into
`ModalOperationFailed`. The Modal token (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET) is read from the
environment for each call and goes only into `modal.Client.from_credentials`. Nothing in the
sandbox needs it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bb_environments.providers.contract import (
    READY,
    Availability,
    BaseHead,
    BindContext,
    CreateContext,
    Created,
    CreateResult,
    InvalidInputs,
    Policy,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveResult,
    Reporter,
    Requires,
    SilentReporter,
    inputs_as,
    translate_errors,
)
from bb_environments.providers.git_commands import run_git_or_none
from bb_environments.providers.git_worktree import repo_dir_name
from bb_environments.providers.modal_pool import OriginHeads, bind_member, bound_tags
from bb_environments.providers.modal_scripts import CLONE_SCRIPT, SETUP_SCRIPT
from bb_environments.providers.modal_sdk import POLL_INTERVAL_S, ModalOperationFailed, ModalSdk, ModalSession, redact
from bb_environments.providers.modal_settings import (
    NO_CREDENTIALS,
    PROVIDER_ID,
    DockerfileError,
    SettingsError,
    credentials_from_env,
    effective_dockerfile,
    load_settings,
)

PATH_KEY_TAG = "bb-path-key"
WORKSPACE_ROOT = "/workspace"
CLONE_TIMEOUT_S = 900
SETUP_TIMEOUT_S = 900
SNAPSHOT_TIMEOUT_S = 300
OUTPUT_LINE_LIMIT = 200
# Modal tag values: at most 63 of [A-Za-z0-9._-].
TAG_VALUE_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


class ModalInputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    cpu: float = 2.0
    memory_mib: int = 4096
    timeout_hours: int = 24
    """The sandbox's lifetime; Modal stops a sandbox after 24 hours at most."""


INPUT_BOUNDS: dict[str, tuple[float, float]] = {
    "cpu": (0.25, 16.0),
    "memoryMib": (512, 65_536),
    "timeoutHours": (1, 24),
}


class ModalSandboxProvider:
    id = PROVIDER_ID
    display_name = "Modal sandbox"
    requires = Requires(git_checkout=True)
    policy = Policy(path_keys="per-attempt", retire_grace_ms=300_000, pool=True)
    inputs_type = ModalInputs
    in_the_cloud = True

    def __init__(
        self,
        sdk: ModuleType | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
        origin_heads: OriginHeads | None = None,
    ) -> None:
        """`sdk` is the `modal` module (imported on first use) or a stand-in with the same API;
        `origin_heads` keeps the origins' heads between reads (a test gives it a clock)."""
        self._modal = ModalSdk(sdk, poll_interval_s)
        self._origin_heads = origin_heads or OriginHeads()

    # -- the contract ------------------------------------------------------------------------------

    def availability(self, ctx: ProjectContext) -> Availability:
        try:
            effective_dockerfile(ctx.data_dir, load_settings(ctx.data_dir))
        except (SettingsError, DockerfileError, OSError) as bad:
            return Availability("blocked", str(bad))
        if credentials_from_env() is None:
            return Availability("blocked", NO_CREDENTIALS)
        return READY

    def validate(self, ctx: ProjectContext) -> None:
        check_bounds(inputs_as(ctx, ModalInputs))
        project_origin(ctx.project_path)
        try:
            effective_dockerfile(ctx.data_dir, load_settings(ctx.data_dir))
        except (SettingsError, DockerfileError) as bad:
            raise InvalidInputs(f"Modal settings: {bad}") from None

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str | None:
        return None  # nothing local to claim: the workspace lives in the sandbox

    def create(self, ctx: CreateContext) -> CreateResult:
        with translate_errors(ModalOperationFailed, InvalidInputs, SettingsError, DockerfileError) as failed:
            return self._create(ctx)
        return failed.create_failed()

    def remove(self, ctx: RemoveContext) -> RemoveResult:
        with translate_errors(ModalOperationFailed, SettingsError) as failed:
            self._remove(ctx)
            return Removed()
        return failed.remove_failed()

    # -- warm pools (SPEC 10): providers/modal_pool.py ------------------------------------------

    def base_head(self, ctx: ProjectContext) -> BaseHead:
        origin = project_origin(ctx.project_path)
        assert ctx.project_path is not None  # project_origin refuses a request without one
        return self._origin_heads.head(ctx.project_path, origin, url_secrets(origin))

    def member_inputs(self, ctx: ProjectContext, path_key: str) -> ModalInputs:
        """The request's own: a sandbox's size and lifetime name nothing of its thread."""
        inputs = inputs_as(ctx, ModalInputs)
        check_bounds(inputs)
        return inputs

    def bind(self, ctx: BindContext) -> dict[str, Any] | None:
        return bind_member(self._modal, ctx.resource or {}, tag_value(ctx.path_key))

    # -- pause and resume (called by the core's idle tracking) ------------------------------------

    def idle_pause_due(self, last_activity: datetime, now: datetime, data_dir: str) -> bool:
        """True when the environment has been idle at least `idlePauseMinutes` (0 never pauses)."""
        minutes = load_settings(data_dir).idle_pause_minutes
        return minutes > 0 and now - last_activity >= timedelta(minutes=minutes)

    def pause(
        self, resource: dict[str, Any], checkpoint: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Snapshot the filesystem, checkpoint the snapshot, terminate; the returned resource is paused.

        If the snapshot fails the sandbox keeps running and ModalOperationFailed is raised.
        `checkpoint` receives the resource naming the new snapshot before the sandbox is terminated,
        so a crash in between loses neither the sandbox nor the snapshot. That resource also names
        the sandbox snapshotted (`snapshotOf`), so a pause re-run after a crash that followed the
        termination finishes the pause instead of failing on the stopped sandbox.
        """
        sandbox_id = resource.get("sandboxId")
        if sandbox_id is None:
            raise ModalOperationFailed("the sandbox is already paused")
        with self._modal.connect() as session:
            sandbox = session.sandbox(sandbox_id)
            if session.has_stopped(sandbox):
                if resource.get("snapshotOf") == sandbox_id:
                    # An earlier pause checkpointed this sandbox's snapshot, terminated it and was
                    # killed before the core recorded Paused: the snapshot holds the last state.
                    return _paused(resource)
                raise ModalOperationFailed(f"sandbox {sandbox_id} has already stopped, so there is nothing to snapshot")
            snapshot = session.snapshot(sandbox, SNAPSHOT_TIMEOUT_S)
            superseded = [*resource.get("supersededSnapshotIds", []), *_present(resource.get("snapshotId"))]
            snapshotted = {
                **resource,
                "snapshotId": snapshot.object_id,
                "supersededSnapshotIds": superseded,
                "snapshotOf": sandbox_id,
            }
            if checkpoint is not None:
                checkpoint(snapshotted)
            session.terminate(sandbox, "terminate the sandbox")
        return _paused(snapshotted)

    def resume(self, resource: dict[str, Any]) -> dict[str, Any]:
        """Start a sandbox from the snapshot with the same tags (setup does not run again), and
        that of the thread a pool's member was bound to while paused.

        A sandbox still running under the path key (a pause that never terminated, a resume that
        crashed after starting one) is reused instead of starting a second.
        """
        snapshot_id = resource.get("snapshotId")
        if snapshot_id is None:
            raise ModalOperationFailed("the environment has no snapshot to resume from")
        tags = environment_tags(resource["pathKey"])
        with self._modal.connect() as session:
            app = session.app(resource["appName"], create_if_missing=True)
            sandbox = _adopt_running(session, app, tags, SilentReporter())
            if sandbox is None:
                image = session.snapshot_image(snapshot_id)
                sandbox = session.start_sandbox(app, image, tags | bound_tags(resource), _resource_inputs(resource))
            elif not bound_tags(resource).items() <= session.tags(sandbox).items():
                session.set_tags(sandbox, session.tags(sandbox) | bound_tags(resource))
            session.delete_images(resource.get("supersededSnapshotIds", []))
        return {**resource, "sandboxId": sandbox.object_id, "supersededSnapshotIds": []}

    # -- create ------------------------------------------------------------------------------------

    def _create(self, ctx: CreateContext) -> Created:
        inputs = inputs_as(ctx, ModalInputs)
        check_bounds(inputs)
        origin = project_origin(ctx.project_path)
        workdir = f"{WORKSPACE_ROOT}/{repo_dir_name(_toplevel(ctx.project_path))}"
        settings = load_settings(ctx.data_dir)
        dockerfile = effective_dockerfile(ctx.data_dir, settings)
        tags = environment_tags(ctx.path_key)
        with self._modal.connect() as session:
            app = session.app(settings.app_name, create_if_missing=True)
            image = session.ensure_image(app, dockerfile, Path(ctx.data_dir), ctx.report)
            ctx.raise_if_cancelled()
            sandbox = _adopt_running(session, app, tags, ctx.report)
            if sandbox is None:
                ctx.report.step("Starting a Modal sandbox")
                sandbox = session.start_sandbox(app, image, tags, inputs)
            ctx.report.log(f"Sandbox {sandbox.object_id} (tag {PATH_KEY_TAG}={tags[PATH_KEY_TAG]})")
            try:
                ctx.raise_if_cancelled()
                ctx.report.step(f"Cloning {redact_url(origin)} into {workdir}")
                _run_script(
                    session,
                    sandbox,
                    CLONE_SCRIPT,
                    workdir,
                    ctx,
                    CLONE_TIMEOUT_S,
                    "git clone",
                    stdin=origin + "\n",
                    secrets=url_secrets(origin),
                )
                ctx.raise_if_cancelled()
                ctx.report.step("Running .bb-env-setup.sh in the sandbox")
                _run_script(session, sandbox, SETUP_SCRIPT, workdir, ctx, SETUP_TIMEOUT_S, ".bb-env-setup.sh")
                ctx.raise_if_cancelled()
            except BaseException:
                # Whatever stopped the create, the sandbox must not run on, billed, with no owner.
                ctx.report.step(f"Terminating sandbox {sandbox.object_id}")
                session.terminate_quietly(sandbox, ctx.report)
                raise
        return Created(
            path=sandbox_path(ctx.path_key, workdir),
            owns_path=False,
            resource={
                "sandboxId": sandbox.object_id,
                "imageId": image.object_id,
                "snapshotId": None,
                "supersededSnapshotIds": [],
                "appName": settings.app_name,
                "pathKey": ctx.path_key,
                "workdir": workdir,
                "cpu": inputs.cpu,
                "memoryMib": inputs.memory_mib,
                "timeoutHours": inputs.timeout_hours,
            },
        )

    # -- remove ------------------------------------------------------------------------------------

    def _remove(self, ctx: RemoveContext) -> None:
        resource = ctx.resource or {}
        app_name = resource.get("appName") or load_settings(ctx.data_dir).app_name
        with self._modal.connect() as session:
            app = session.app(app_name, create_if_missing=False)
            sandbox_ids = list(_present(resource.get("sandboxId")))
            if app is not None:
                tagged = session.running_sandboxes(app, environment_tags(ctx.path_key))
                sandbox_ids += [s.object_id for s in tagged if s.object_id not in sandbox_ids]
            for sandbox_id in sandbox_ids:
                ctx.raise_if_cancelled()
                ctx.report.step(f"Terminating sandbox {sandbox_id}")
                session.terminate_by_id(sandbox_id)
            snapshots = [*_present(resource.get("snapshotId")), *resource.get("supersededSnapshotIds", [])]
            if snapshots:
                ctx.report.step(f"Deleting {len(snapshots)} snapshot(s); the shared image is kept")
                session.delete_images(snapshots)


def _paused(snapshotted: dict[str, Any]) -> dict[str, Any]:
    """The resource of a finished pause: no sandbox, and no pause in flight to finish."""
    return {**{k: v for k, v in snapshotted.items() if k != "snapshotOf"}, "sandboxId": None}


def _adopt_running(session: ModalSession, app: Any, tags: dict[str, str], report: Reporter) -> Any | None:
    """The running sandbox an earlier attempt left under these tags; any extra ones are terminated."""
    running = session.running_sandboxes(app, tags)
    if not running:
        return None
    adopted, *extra = running
    report.step(f"Reusing sandbox {adopted.object_id}, left by an earlier attempt")
    for sandbox in extra:
        report.log(f"Terminating the duplicate sandbox {sandbox.object_id}")
        session.terminate(sandbox, "terminate a duplicate sandbox")
    return adopted


def _run_script(
    session: ModalSession,
    sandbox: Any,
    script: str,
    argument: str,
    ctx: CreateContext,
    timeout_s: int,
    label: str,
    stdin: str = "",
    secrets: tuple[str, ...] = (),
) -> None:
    """Run `bash -c script` with one argument; `stdin` is the only way secrets reach the process."""
    returncode, output = session.run_script(sandbox, script, argument, timeout_s, label, stdin, ctx.raise_if_cancelled)
    output = redact(output, secrets)
    for line in _capped_lines(output):
        ctx.report.log(line)
    if returncode != 0:
        last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
        raise ModalOperationFailed(f"{label} failed in the sandbox (exit {returncode}): {last.strip()}")


def environment_tags(path_key: str) -> dict[str, str]:
    return {PATH_KEY_TAG: tag_value(path_key)}


def tag_value(text: str) -> str:
    """`text` when Modal accepts it as a tag value, else a stable digest of it."""
    if TAG_VALUE_PATTERN.fullmatch(text):
        return text
    return "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:56]


def sandbox_path(path_key: str, workdir: str) -> str:
    """Stable across pause/resume (the sandbox id is not): the tag names the environment's sandbox."""
    return f"modal://{tag_value(path_key)}{workdir}"


def project_origin(project_path: str | None) -> str:
    """The URL the sandbox clones from: the checkout's `origin` remote, reachable over the network."""
    if project_path is None:
        raise InvalidInputs("project path: a git checkout with an origin remote is required")
    url = run_git_or_none(project_path, "remote", "get-url", "origin")
    if url is None:
        raise InvalidInputs(
            f"project path: {project_path} has no origin remote; the sandbox clones the project from it"
        )
    if _is_local_url(url):
        raise InvalidInputs(
            f"project path: the origin remote of {project_path} is a local path, which a Modal sandbox cannot reach"
        )
    return url


def url_secrets(url: str) -> tuple[str, ...]:
    """The parts of a clone URL that must not be shown: its user-info (a token, say)."""
    userinfo = urlsplit(url).netloc.rpartition("@")[0] if "://" in url else ""
    return (userinfo,) if userinfo else ()


def redact_url(url: str) -> str:
    return redact(url, url_secrets(url))


def _capped_lines(output: str) -> list[str]:
    lines = output.splitlines()
    if len(lines) <= OUTPUT_LINE_LIMIT:
        return lines
    return [f"({len(lines) - OUTPUT_LINE_LIMIT} earlier lines left out)", *lines[-OUTPUT_LINE_LIMIT:]]


def check_bounds(inputs: ModalInputs) -> None:
    for name, value in msgspec.to_builtins(inputs).items():
        low, high = INPUT_BOUNDS[name]
        if not low <= value <= high:
            raise InvalidInputs(f"{name}: must be between {low:g} and {high:g}, got {value:g}")


def _resource_inputs(resource: dict[str, Any]) -> ModalInputs:
    defaults = ModalInputs()
    return ModalInputs(
        cpu=resource.get("cpu", defaults.cpu),
        memory_mib=resource.get("memoryMib", defaults.memory_mib),
        timeout_hours=resource.get("timeoutHours", defaults.timeout_hours),
    )


def _present(value: str | None) -> list[str]:
    return [value] if value else []


def _is_local_url(url: str) -> bool:
    if "://" in url:
        return url.lower().startswith("file://")
    # scp-like `host:path` has a colon before any slash; a plain path has none.
    head, colon, _ = url.partition(":")
    return not colon or "/" in head


def _toplevel(project_path: str | None) -> str:
    return (
        (run_git_or_none(project_path, "rev-parse", "--show-toplevel") if project_path else None)
        or project_path
        or "project"
    )
