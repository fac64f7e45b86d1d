"""Planning a workspace on its host, before anything is written or touched: read-only.

The request's project and inputs are checked (a project that is not a directory, or is bb's own
data dir; inputs the provider's type refuses; a project its provider cannot serve), then the
provider validates the request and plans the path it will claim. What is refused raises the
contract's `InvalidInputs` (the request is wrong) or `PlanRefused` (the provider cannot create here
now), whose messages name the field and what is allowed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from bb_environments.domain.ids import quoted
from bb_environments.providers.contract import (
    BaseHead,
    BaseUnknown,
    EnvironmentProvider,
    InvalidInputs,
    PlanRefused,
    PoolingProvider,
    ProjectContext,
    can_pool,
    shares_planned_path,
)
from bb_environments.providers.registry import safe_availability


def canonical_path(path: str) -> str:
    """A local path with symlinks and `..` resolved, so an alias claims the same path; a
    provider's non-local path (`modal://...`) is its own identity."""
    return os.path.realpath(path) if os.path.isabs(path) else path


def canonical_project(project_path: str | None) -> str | None:
    if project_path is None:
        return None
    if "\0" in project_path:  # the OS reads no such path: os.path would raise ValueError, not say why
        raise InvalidInputs(f"project path {project_path!r} contains a NUL character, which no path may contain")
    if not os.path.isabs(project_path):
        raise InvalidInputs(f"project path {quoted(project_path)} must be absolute")
    canonical = os.path.realpath(project_path)
    if not os.path.isdir(canonical):
        raise InvalidInputs(f"project path {quoted(project_path)} is not a directory")
    return canonical


def check_within_roots(project_path: str | None, roots: tuple[str, ...] | None) -> None:
    """Refuse a project outside BB_PROJECT_ROOTS (`roots`, canonical; None: anywhere)."""
    if roots is None or project_path is None:
        return
    if not any(project_path == root or project_path.startswith(root.rstrip("/") + "/") for root in roots):
        raise InvalidInputs(
            f"project {quoted(project_path)} is outside BB_PROJECT_ROOTS: projects must lie in {', '.join(roots)}"
        )


def checked_project(provider: EnvironmentProvider, project_path: str | None, data_dir: str) -> str | None:
    """The request's project in canonical form, if this provider can serve it (`data_dir`: bb's, canonical)."""
    project = canonical_project(project_path)
    if project is not None:
        _check_project(project, data_dir)
    if provider.requires.projectless and project is not None:
        raise InvalidInputs(f"provider {provider.id!r} serves only threads without a project")
    if (provider.requires.git_checkout or provider.requires.project_checkout) and project is None:
        raise InvalidInputs(f"provider {provider.id!r} needs a project: pass --project PATH")
    return project


def decode_inputs(provider: EnvironmentProvider, raw: Any) -> Any:
    """The inputs as the provider's `inputs_type` reads them."""
    if provider.inputs_type is None:
        if raw not in (None, {}):
            raise InvalidInputs(f"provider {provider.id!r} takes no inputs, but the request carried some")
        return None
    try:
        return msgspec.convert({} if raw is None else raw, provider.inputs_type)
    except msgspec.ValidationError as error:
        raise InvalidInputs(f"invalid inputs for provider {provider.id!r}: {_readable(error)}") from None


def check_available(provider: EnvironmentProvider, context: ProjectContext) -> None:
    availability = safe_availability(provider, context)
    if availability.status != "ready":
        raise PlanRefused(f"provider {provider.id!r} is blocked: {availability.reason}")


def plan_path(provider: EnvironmentProvider, context: ProjectContext, path_key: str) -> tuple[str | None, bool]:
    """Check the inputs, then plan the path and whether a thread joins whoever holds it: in one
    trip to a worker thread, since each of them may run git."""
    provider.validate(context)
    return provider.planned_path(context, path_key), shares_planned_path(provider, context)


def member_inputs(provider: EnvironmentProvider, context: ProjectContext, path_key: str) -> Any:
    """The inputs of a pool's member planned under `path_key`; refused when the provider cannot pool."""
    if not can_pool(provider):
        raise InvalidInputs(f"provider {provider.id!r} cannot keep a warm pool (its policy.pool is false)")
    return provider.member_inputs(context, path_key)


def read_base_head(provider: PoolingProvider, context: ProjectContext, member: bool) -> BaseHead | None:
    """Where a pool's member would be prepared now. When the provider cannot tell now, a thread's
    placement goes on without it (no member is bound: the thread gets a cold environment) and a
    member's is refused (the pool prepares none until it can)."""
    try:
        return provider.base_head(context)
    except BaseUnknown as unknown:
        if member:
            raise PlanRefused(f"the pool cannot prepare a member now: {unknown}") from None
        return None


def claimed_path(planned: str | None, data_dir: str) -> str | None:
    """The planned path in canonical form, the path the environment claims (None: not knowable)."""
    if not planned:
        return None
    claimed = canonical_path(planned)
    if os.path.isabs(claimed):
        _check_workspace(claimed, data_dir)
    return claimed


def _check_project(project: str, data_dir: str) -> None:
    """Refuse bb's data dir (its own state and workspaces, which come and go) and a .git directory
    (git's alone) as a project, for every provider."""
    if Path(project).is_relative_to(data_dir):
        where = "is" if project == data_dir else "is inside"
        raise InvalidInputs(
            f"project path {project!r} {where} bb's data dir {data_dir!r}, which holds bb's own state "
            "and workspaces; pass a project directory outside it"
        )
    _refuse_git_directory("project path", project)


def _check_workspace(path: str, data_dir: str) -> None:
    """Refuse a workspace around the data dir: its claim would overlap every workspace made there,
    so no other environment could be created until it is deleted (`/`, say)."""
    if Path(data_dir).is_relative_to(path):
        raise InvalidInputs(
            f"workspace path {path!r} contains bb's data dir {data_dir!r}, so claiming it would block "
            "every other environment; choose a directory that does not contain the data dir"
        )
    _refuse_git_directory("workspace path", path)


def _refuse_git_directory(label: str, path: str) -> None:
    if ".git" in Path(path).parts:
        raise InvalidInputs(
            f"{label} {path!r} is inside a .git directory, which only git may change; "
            "choose a directory of the checkout itself"
        )


def _readable(error: msgspec.ValidationError) -> str:
    # msgspec says "... - at `$.branch.name`"; users think in field names, not JSON paths.
    return re.sub(r"`\$\.?([^`]*)`", lambda m: f"`{m.group(1) or 'inputs'}`", str(error))
