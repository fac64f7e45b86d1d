"""The application service (the use cases): load aggregates, ask them to change, save what changed in one transaction.

Synchronous on purpose (the eventsourcing library is); the service calls it from one writer
thread. Every command is safe to repeat: a repeated command finds the state already changed and
records nothing. Every command takes values, never an aggregate, so the Store can run one again
from its arguments when its save lost a race with another writer (handlers/writers.py).

The use cases are grouped by concern: the threads' (handlers/thread_use_cases.py), the steps of
an environment's provisioning (handlers/provisioning_steps.py), and here what `bb doctor` compares
with the hosts; the saves and lookups they share are in handlers/indexed_application.py.
"""

from __future__ import annotations

from collections.abc import Collection
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import Aggregate

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import UnknownEnvironment
from bb_environments.domain.host_claims import HostClaims
from bb_environments.domain.thread import Thread, thread_aggregate_id
from bb_environments.handlers.claiming import HOST_CLAIMS_SNAPSHOT_INTERVAL
from bb_environments.handlers.pool_use_cases import PoolUseCases
from bb_environments.handlers.provisioning_steps import ProvisioningSteps


class Environments(PoolUseCases, ProvisioningSteps):
    name = "Environments"
    log_section_size = 500
    snapshotting_intervals = {HostClaims: HOST_CLAIMS_SNAPSHOT_INTERVAL}

    def environment_hosts(self, environment_ids: list[UUID]) -> dict[UUID, str]:
        """The host each of these environments was placed on, for those the log has (an
        environment's host never changes): whose agent may write its transcript lines."""
        hosts = {}
        for environment_id in environment_ids:
            try:
                found: Aggregate = self.repository.get(environment_id, deepcopy_from_cache=self.repository.fastforward)
            except AggregateNotFoundError:
                continue
            if isinstance(found, Environment):  # an id of another aggregate names no environment
                hosts[environment_id] = found.host_id
        return hosts

    # -- what bb doctor compares with the hosts ---------------------------------------------------

    def live_environments(self) -> list[Environment]:
        """Every environment not removed, as the log has it now."""
        return [self.environment(environment_id) for environment_id in self.unfinished_environment_ids()]

    def worktree_projects(self) -> dict[str, list[str]]:
        """By host, the projects git-worktree environments were claimed in, removed ones included:
        where worktrees and branches of bb's layout can be."""
        return self._worktree_projects.by_host()

    def environments_of_thread(self, thread_id: str) -> list[Environment]:
        """Every environment the thread was ever given, removed ones included, as the log has them now."""
        if thread_id not in self._registered:
            return []
        assigned = {
            event.environment_id  # type: ignore[attr-defined]
            for event in self.repository.event_store.get(thread_aggregate_id(thread_id))
            if isinstance(event, Thread.EnvironmentAssigned)
        }
        return [self.environment(environment_id) for environment_id in sorted(assigned)]

    def record_workspace_vanished(self, environment_id: UUID, path: str) -> Environment:
        """The workspace at `path` is gone from its host; a claim on it beside the claimed path
        (the provider chose another) is released in the same save, as a removal releases it."""
        environment = self._changing_environment(environment_id)
        if not environment.record_workspace_vanished(path):
            return environment
        claims = self.claims.on_host(environment.host_id)
        if path != environment.claimed_path:
            claims.release(path, environment.id)
        self.save(environment, *claims.changed)
        return environment

    # -- the workspaces' sizes on disk (handlers/disk_usage.py) -----------------------------------

    def measurable_workspaces(self, among: Collection[UUID] | None = None) -> list[tuple[UUID, str, str, str]]:
        """Each live environment (of `among`, if given) settled on a workspace to measure: its id,
        host, provider and path."""
        environments = self.live_environments() if among is None else self._environments_among(among)
        return [
            (environment.id, environment.host_id, environment.provider_id, environment.path)
            for environment in environments
            if environment.disk_measurable and environment.path is not None
        ]

    def _environments_among(self, environment_ids: Collection[UUID]) -> list[Environment]:
        found = []
        for environment_id in environment_ids:
            try:
                found.append(self.environment(environment_id))
            except UnknownEnvironment:
                continue
        return found

    def record_disk_usage(self, figures: list[tuple[UUID, str, int]]) -> list[Environment]:
        """Each workspace (environment id, path) takes the bytes given now: the environments whose
        figure was worth recording (see Environment.record_disk_usage), saved together, in one
        transaction for a whole host's pass."""
        changed = []
        for environment_id, path, disk_bytes in figures:
            try:
                environment = self._changing_environment(environment_id)
            except UnknownEnvironment:
                continue
            if environment.record_disk_usage(path, disk_bytes):
                changed.append(environment)
        if changed:
            self.save(*changed)
        return changed
