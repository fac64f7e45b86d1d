"""Deciding where a thread's environment will live, before anything is written or touched.

Everything a request can get wrong is found here (unknown provider, malformed inputs, a refused
branch name, a project that is not a repository) and answered with an error that names the field
and what is allowed. Only read-only provider calls happen here.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec

from bb_environments.handlers.application import Placement
from bb_environments.domain.ids import ID_PATTERN, quoted
from bb_environments.handlers.commands import NewEnvironment
from bb_environments.handlers.errors import InvalidInput, Refused
from bb_environments.providers.contract import EnvironmentProvider, InvalidInputs, ProjectContext, shares_planned_path
from bb_environments.providers.registry import ProviderRegistry, safe_availability

THREAD_ID = re.compile(ID_PATTERN)
HOST_ID = THREAD_ID


def check_thread_id(thread_id: str) -> str:
    if not THREAD_ID.match(thread_id):
        raise InvalidInput(
            f"thread id {quoted(thread_id)} is not allowed: use 1-128 letters, digits, '-' or '_', starting with a letter or digit"
        )
    return thread_id


def check_host_id(host_id: str) -> str:
    if not HOST_ID.match(host_id):
        raise InvalidInput(f"host id {quoted(host_id)} is not allowed: use letters, digits, '-' or '_'")
    return host_id


def canonical_path(path: str) -> str:
    """A local path with symlinks and `..` resolved, so an alias claims the same path; a
    provider's non-local path (`modal://...`) is its own identity."""
    return os.path.realpath(path) if os.path.isabs(path) else path


def check_environment_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise InvalidInput(f"environment id {quoted(text)} is not a valid id (expected a UUID)") from None


def canonical_project(project_path: str | None) -> str | None:
    if project_path is None:
        return None
    if "\0" in project_path:  # the OS reads no such path: os.path would raise ValueError, not say why
        raise InvalidInput(f"project path {project_path!r} contains a NUL character, which no path may contain")
    if not os.path.isabs(project_path):
        raise InvalidInput(f"project path {quoted(project_path)} must be absolute")
    canonical = os.path.realpath(project_path)
    if not os.path.isdir(canonical):
        raise InvalidInput(f"project path {quoted(project_path)} is not a directory")
    return canonical


class Placer:
    def __init__(self, registry: ProviderRegistry, data_dir: Path, host_id: str = "local") -> None:
        self.registry = registry
        self.data_dir = data_dir
        self.host_id = host_id

    def provider_dir(self, provider_id: str) -> Path:
        return self.data_dir / "providers" / provider_id

    def provider(self, provider_id: str) -> EnvironmentProvider:
        provider = self.registry.get(provider_id)
        if provider is None:
            available = ", ".join(self.registry.ids()) or "none"
            raise InvalidInput(f"unknown environment provider {provider_id!r}; available: {available}")
        return provider

    def context(self, provider: EnvironmentProvider, host_id: str, project_path: str | None, inputs: Any) -> ProjectContext:
        """What the provider learns of a request; creating its data dir is left to create."""
        data_dir = self.provider_dir(provider.id)
        return ProjectContext(host_id=host_id, project_path=project_path, inputs=inputs, data_dir=str(data_dir))

    async def place(self, thread_id: str, intent: NewEnvironment, project_path: str | None, host_id: str) -> Placement:
        provider = self.provider(intent.provider_id)
        if host_id != self.host_id:
            # Provider calls run where this service runs; only hooks travel to a host's agent.
            raise InvalidInput(f"host {host_id!r} is not served here: this service places environments on host "
                               f"{self.host_id!r} only")
        project = canonical_project(project_path)
        data_dir = os.path.realpath(self.data_dir)
        if project is not None:
            _check_project(project, data_dir)
        if provider.requires.projectless and project is not None:
            raise InvalidInput(f"provider {provider.id!r} serves only threads without a project")
        if (provider.requires.git_checkout or provider.requires.project_checkout) and project is None:
            raise InvalidInput(f"provider {provider.id!r} needs a project: pass --project PATH")
        inputs = decode_inputs(provider, intent.inputs)
        context = self.context(provider, host_id, project, inputs)
        availability = safe_availability(provider, context)
        if availability.status != "ready":
            raise Refused(f"provider {provider.id!r} is blocked: {availability.reason}")
        path_key = thread_id if provider.policy.path_keys == "per-thread" else f"{thread_id}-1"
        try:
            planned, shares = await asyncio.to_thread(_plan, provider, context, path_key)
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None
        claimed_path = canonical_path(planned) if planned else None
        if claimed_path is not None and os.path.isabs(claimed_path):
            _check_workspace(claimed_path, data_dir)
        return Placement(
            provider_id=provider.id, host_id=host_id, project_path=project,
            inputs=msgspec.to_builtins(inputs), path_key=path_key, claimed_path=claimed_path,
            shares_claimed_path=shares,
        )


    async def next_attempt(self, provider_id: str, thread_id: str, attempt: int, host_id: str,
                           project_path: str | None, inputs: Any, path_key: str) -> tuple[str, str | None]:
        """The path key and claimed path of the attempt after `attempt`."""
        provider = self.provider(provider_id)
        if provider.policy.path_keys == "per-thread":
            next_key = path_key
        else:
            next_key = f"{thread_id}-{attempt + 1}"
        context = self.context(provider, host_id, project_path, decode_inputs(provider, inputs))
        planned = await asyncio.to_thread(provider.planned_path, context, next_key)
        return next_key, canonical_path(planned) if planned else None


def _plan(provider: EnvironmentProvider, context: ProjectContext, path_key: str) -> tuple[str | None, bool]:
    """Check the inputs, then plan the path and whether a thread joins whoever holds it: in one
    trip to a worker thread, since each of them may run git."""
    provider.validate(context)
    return provider.planned_path(context, path_key), shares_planned_path(provider, context)


def _check_project(project: str, data_dir: str) -> None:
    """Refuse bb's data dir (its own state and workspaces, which come and go) and a .git directory
    (git's alone) as a project, for every provider."""
    if Path(project).is_relative_to(data_dir):
        where = "is" if project == data_dir else "is inside"
        raise InvalidInput(f"project path {project!r} {where} bb's data dir {data_dir!r}, which holds bb's own state "
                           "and workspaces; pass a project directory outside it")
    _refuse_git_directory("project path", project)


def _check_workspace(path: str, data_dir: str) -> None:
    """Refuse a workspace around the data dir: its claim would overlap every workspace made there,
    so no other environment could be created until it is deleted (`/`, say)."""
    if Path(data_dir).is_relative_to(path):
        raise InvalidInput(f"workspace path {path!r} contains bb's data dir {data_dir!r}, so claiming it would block "
                           "every other environment; choose a directory that does not contain the data dir")
    _refuse_git_directory("workspace path", path)


def _refuse_git_directory(label: str, path: str) -> None:
    if ".git" in Path(path).parts:
        raise InvalidInput(f"{label} {path!r} is inside a .git directory, which only git may change; "
                           "choose a directory of the checkout itself")


def decode_inputs(provider: EnvironmentProvider, raw: Any) -> Any:
    if provider.inputs_type is None:
        if raw not in (None, {}):
            raise InvalidInput(f"provider {provider.id!r} takes no inputs, but the request carried some")
        return None
    try:
        return msgspec.convert({} if raw is None else raw, provider.inputs_type)
    except msgspec.ValidationError as error:
        raise InvalidInput(f"invalid inputs for provider {provider.id!r}: {_readable(error)}") from None


def _readable(error: msgspec.ValidationError) -> str:
    # msgspec says "... - at `$.branch.name`"; users think in field names, not JSON paths.
    return re.sub(r"`\$\.?([^`]*)`", lambda m: f"`{m.group(1) or 'inputs'}`", str(error))
