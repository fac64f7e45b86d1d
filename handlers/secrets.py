"""`bb secret set|list|remove` and the secrets a hook gets (SPEC 11).

The log records which secrets a project has (domain/project_secrets.py); the values are the
secret store's (providers/host/secret_store.py), under this core's data dir. A value is written
before its name is recorded and deleted before its removal is: a kill in between leaves a name
the log records with no value (the hooks get nothing for it; `set` or `remove` again ends that)
or a value no recorded name gives to any hook. A hook gets the values of the names its
environment's project has when it starts, and only a hook the log awaits on the host that asks.

Replicas on one store each keep their own values: a replica that sets or removes one tells the
others (`SecretPeers`, bus/core/secret_sharing.py), which take it only as the log has it. A replica
whose copy lacks a value the log names, or holds an older one, asks the others for theirs; while
one of them has not answered it gives a hook no partial set (SecretsLacking: the agent asks again,
perhaps of another replica).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic

from bb_environments.domain.ids import quoted
from bb_environments.domain.project_secrets import ProjectSecrets, project_secrets_id
from bb_environments.domain.request_errors import InvalidInput, NotFound
from bb_environments.domain.secret_names import secret_name_refusal
from bb_environments.handlers.application import Environments
from bb_environments.handlers.store import Store
from bb_environments.providers.contract import InvalidInputs
from bb_environments.providers.git_commands import run_git_or_none
from bb_environments.providers.host.crash_points import crash_point
from bb_environments.providers.host.secret_store import SecretStore, StoredSecret
from bb_environments.providers.planning import canonical_project, check_within_roots

MAX_SECRET_BYTES = 16 * 1024
"""Far more than any token or key a setup needs, and within an API request (64 KiB) however escaped."""


@dataclass(frozen=True)
class SecretEntry:
    name: str
    set_at: datetime


@dataclass(frozen=True)
class SharedSecret:
    """A value one replica tells another: `value` None, removed."""

    project_path: str
    name: str
    value: str | None
    set_at: datetime | None = None


SharedSecrets = list[SharedSecret]
"""(Named here: `Secrets.list` hides the builtin in that class's annotations.)"""


class SecretsLacking(TimeoutError):
    """This replica lacks a value the log names and another replica may hold: no partial set. A
    TimeoutError, as the agent asking over the bus sees it: the job waits and asks again."""


class SecretPeers(Protocol):
    async def tell(self, change: SharedSecret) -> None:
        """Tell every other present replica (one that misses it asks later)."""

    async def held(self, project_path: str) -> tuple[list[SharedSecret], bool]:
        """The project's values the other replicas hold, and whether every one of them answered."""


class NoPeers:
    """The only replica: nobody to tell or ask."""

    async def tell(self, change: SharedSecret) -> None:
        return None

    async def held(self, project_path: str) -> tuple[list[SharedSecret], bool]:
        return [], True


class Secrets:
    def __init__(
        self,
        store: Store,
        values: SecretStore,
        project_roots: tuple[str, ...] | None = None,
        peers: SecretPeers | None = None,
    ) -> None:
        """`project_roots`: the canonical directories a project must lie in (None: anywhere)."""
        self._store = store
        self._values = values
        self._project_roots = project_roots
        self.peers: SecretPeers = peers or NoPeers()
        """Set by `bb serve` once it knows the other replicas."""

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
        await asyncio.to_thread(self._values.put, project, name, value, set_at.isoformat())
        await self.peers.tell(SharedSecret(project, name, value, set_at))
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
        await self.peers.tell(SharedSecret(project, name, None))
        return project

    async def received(self, change: SharedSecret) -> None:
        """Another replica's set or removal, taken only as the log has it now."""
        recorded = await self._store.run(_recorded_names, self._store.app, change.project_path)
        if change.value is None:
            if change.name not in recorded:
                await asyncio.to_thread(self._values.delete, change.project_path, change.name)
            return
        if change.set_at is None or recorded.get(change.name) != change.set_at:
            return  # not the value the log has now: a later set's message follows, or came first
        held = (await asyncio.to_thread(self._values.entries, change.project_path)).get(change.name)
        if held is None or _older(held, change.set_at):
            await asyncio.to_thread(
                self._values.put, change.project_path, change.name, change.value, change.set_at.isoformat()
            )

    async def fetch_lacking(self) -> None:
        """Ask the other replicas for each value the log names and this replica lacks (at start-up:
        a replica away while one was set was not told)."""
        for project in await self._store.run(_projects_with_secrets, self._store.app):
            recorded = await self._store.run(_recorded_names, self._store.app, project)
            if _lacking(await asyncio.to_thread(self._values.entries, project), recorded):
                for secret in (await self.peers.held(project))[0]:
                    await self.received(secret)

    async def shareable(self, project_path: str) -> SharedSecrets:
        """The values this replica holds as the log has them, for another replica that lacks them."""
        recorded = await self._store.run(_recorded_names, self._store.app, project_path)
        held = await asyncio.to_thread(self._values.entries, project_path)
        return [
            SharedSecret(project_path, name, held[name].value, set_at)
            for name, set_at in recorded.items()
            if name in held and _as_of(held[name], set_at)
        ]

    async def for_hook(self, operation_id: str, host_id: str) -> dict[str, str]:
        """The secrets of the hook `operation_id` as its variables, if the log awaits it on `host_id`
        and its environment has a project; else none."""
        if isinstance(self.peers, NoPeers) and not await asyncio.to_thread(self._values.holds_any):
            return {}  # no trip to the store's writer for a hook where no project has secrets
        found = await self._store.run(_hook_secret_names, self._store.app, operation_id, host_id)
        if found is None:
            return {}
        project, recorded = found
        if _lacking(await asyncio.to_thread(self._values.entries, project), recorded):
            shared, everyone_answered = await self.peers.held(project)
            for secret in shared:
                await self.received(secret)
            if _lacking(await asyncio.to_thread(self._values.entries, project), recorded) and not everyone_answered:
                raise SecretsLacking(f"project {quoted(project)} has secrets this replica lacks")
        values = await asyncio.to_thread(self._values.values, project)
        return {name: values[name] for name in recorded if name in values}

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


def _projects_with_secrets(app: Environments) -> list[str]:
    started = app.recorder.select_notifications(start=1, limit=10**9, topics=(get_topic(ProjectSecrets.Started),))
    events = [app.mapper.to_domain_event(notification) for notification in started]
    return [event.project_path for event in events if isinstance(event, ProjectSecrets.Started)]


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


def _older(held: StoredSecret, set_at: datetime) -> bool:
    """Whether the copy here is older than the log's set (one of unknown time is not: older data dirs)."""
    return held.set_at is not None and datetime.fromisoformat(held.set_at) < set_at


def _as_of(held: StoredSecret, set_at: datetime) -> bool:
    return held.set_at is not None and datetime.fromisoformat(held.set_at) == set_at


def _lacking(held: dict[str, StoredSecret], recorded: dict[str, datetime]) -> bool:
    return any(name not in held or _older(held[name], set_at) for name, set_at in recorded.items())


def _hook_secret_names(app: Environments, operation_id: str, host_id: str) -> tuple[str, dict[str, datetime]] | None:
    recorded = app.recorded_hook(operation_id)
    if recorded is None or recorded.host_id != host_id or not recorded.awaited:
        return None
    project = app.environment(UUID(recorded.environment_id)).project_path
    if project is None:
        return None
    return project, _recorded_names(app, project)
