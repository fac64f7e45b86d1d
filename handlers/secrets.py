"""`bb secret set|list|remove` and the secrets a hook gets (SPEC 11).

The log records which secrets a project has (domain/project_secrets.py); the values are the
secret store's (providers/host/secret_store.py), under this core's data dir. A value is written
before its name is recorded and deleted before its removal is: a kill in between leaves a name
the log records with no value (the hooks get nothing for it; `set` or `remove` again ends that)
or a value no recorded name gives to any hook. A hook gets the values of the names its
environment's project has when it starts, and only a hook the log awaits on the host that asks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import Aggregate

from bb_environments.domain.ids import quoted
from bb_environments.domain.project_secrets import ProjectSecrets, project_secrets_id
from bb_environments.domain.request_errors import InvalidInput, NotFound
from bb_environments.domain.secret_names import secret_name_refusal
from bb_environments.handlers.application import Environments
from bb_environments.handlers.store import Store
from bb_environments.providers.contract import InvalidInputs
from bb_environments.providers.git_commands import run_git_or_none
from bb_environments.providers.host.crash_points import crash_point
from bb_environments.providers.host.secret_store import SecretStore
from bb_environments.providers.planning import canonical_project, check_within_roots

MAX_SECRET_BYTES = 16 * 1024
"""Far more than any token or key a setup needs, and within an API request (64 KiB) however escaped."""


@dataclass(frozen=True)
class SecretEntry:
    name: str
    set_at: datetime


class Secrets:
    def __init__(self, store: Store, values: SecretStore, project_roots: tuple[str, ...] | None = None) -> None:
        """`project_roots`: the canonical directories a project must lie in (None: anywhere)."""
        self._store = store
        self._values = values
        self._project_roots = project_roots

    async def set(self, project_path: str, name: str, value: str) -> tuple[str, SecretEntry]:
        """The project (canonical) and the secret as recorded."""
        project = await self._checked_project(project_path)
        _check_name(name)
        if not value:
            raise InvalidInput(f"secret {name} was given no value: pipe it on stdin")
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise InvalidInput(f"secret {name} is longer than {MAX_SECRET_BYTES} bytes")
        await asyncio.to_thread(self._values.put, project, name, value)
        crash_point("secret-stored")
        set_at = await self._store.run(_record_set, self._store.app, project, name)
        return project, SecretEntry(name, set_at)

    async def list(self, project_path: str) -> tuple[str, list[SecretEntry]]:
        """The project (canonical) and its secrets, by name; never a value."""
        project = await self._checked_project(project_path)
        recorded = await self._store.run(_recorded_names, self._store.app, project)
        return project, [SecretEntry(name, at) for name, at in sorted(recorded.items())]

    async def remove(self, project_path: str, name: str) -> str:
        """The project (canonical) the secret was removed from."""
        project = await self._checked_project(project_path)
        _check_name(name)
        recorded = await self._store.run(_recorded_names, self._store.app, project)
        await asyncio.to_thread(self._values.delete, project, name)
        crash_point("secret-value-deleted")
        if name not in recorded:
            raise NotFound(
                f"project {quoted(project)} has no secret {name}; it has: {', '.join(sorted(recorded)) or 'none'}"
            )
        await self._store.run(_record_removed, self._store.app, project, name)
        return project

    async def for_hook(self, operation_id: str, host_id: str) -> dict[str, str]:
        """The secrets of the hook `operation_id` as its variables, if the log awaits it on `host_id`
        and its environment has a project; else none."""
        if not await asyncio.to_thread(self._values.holds_any):
            return {}  # no trip to the store's writer for a hook where no project has secrets
        found = await self._store.run(_hook_secret_names, self._store.app, operation_id, host_id)
        if found is None:
            return {}
        project, names = found
        values = await asyncio.to_thread(self._values.values, project)
        return {name: values[name] for name in names if name in values}

    async def _checked_project(self, project_path: str) -> str:
        """The project in canonical form, if it is a git repository (within BB_PROJECT_ROOTS)."""
        try:
            project = canonical_project(project_path)
            assert project is not None
            check_within_roots(project, self._project_roots)
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None
        if await asyncio.to_thread(run_git_or_none, project, "rev-parse", "--git-dir") is None:
            raise InvalidInput(f"project {quoted(project)} is not a git repository")
        return project


def _check_name(name: str) -> None:
    refusal = secret_name_refusal(name)
    if refusal is not None:
        raise InvalidInput(refusal)


def _stored(app: Environments, project: str) -> ProjectSecrets | None:
    try:
        found: Aggregate = app.repository.get(project_secrets_id(project), deepcopy_from_cache=True)
    except AggregateNotFoundError:
        return None
    assert isinstance(found, ProjectSecrets)  # the id is derived for this aggregate only
    return found


def _recorded_names(app: Environments, project: str) -> dict[str, datetime]:
    secrets = _stored(app, project)
    return dict(secrets.set_at) if secrets is not None else {}


def _record_set(app: Environments, project: str, name: str) -> datetime:
    secrets = _stored(app, project) or ProjectSecrets(project_path=project)
    secrets.set(name)
    app.save(secrets)
    return secrets.set_at[name]


def _record_removed(app: Environments, project: str, name: str) -> None:
    secrets = _stored(app, project)
    if secrets is not None and secrets.remove(name):
        app.save(secrets)


def _hook_secret_names(app: Environments, operation_id: str, host_id: str) -> tuple[str, list[str]] | None:
    recorded = app.recorded_hook(operation_id)
    if recorded is None or recorded.host_id != host_id or not recorded.awaited:
        return None
    project = app.environment(UUID(recorded.environment_id)).project_path
    if project is None:
        return None
    return project, sorted(_recorded_names(app, project))
