"""What the application service looks up without a query of the store: each index keeps one answer
up to date from the log's events of a few types (handlers/log_indexes.py), beside the path claims
(handlers/claiming.py) and the host registry (handlers/host_registry.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Notification

from bb_environments.domain.disk import human_bytes
from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import LimitReached
from bb_environments.domain.hook_operations import HookKind
from bb_environments.domain.thread import Thread, thread_aggregate_id
from bb_environments.handlers.log_indexes import LogWatch, aggregate_id
from bb_environments.handlers.writers import Writers
from bb_environments.providers.worktree_survey import PROVIDER_ID as WORKTREE_PROVIDER_ID


class RegisteredThreads:
    """Which threads were ever registered: every new thread is looked up first."""

    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch) -> None:
        self._registered: set[UUID] = set()
        self.index = writers.log_index(app, watch, Thread, ("Registered",), self._fold)

    def __contains__(self, thread_id: str) -> bool:
        self.index.catch_up()
        return thread_aggregate_id(thread_id) in self._registered

    def _fold(self, notification: Notification, event: DomainEventProtocol[UUID] | None) -> None:
        self._registered.add(aggregate_id(notification))


class AwaitingThreads:
    """The threads whose request for an environment was recorded and not yet answered with one."""

    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch) -> None:
        self._requested: set[UUID] = set()
        self.index = writers.log_index(app, watch, Thread, ("EnvironmentRequested", "EnvironmentAssigned"), self._fold)

    def thread_ids(self) -> list[UUID]:
        """Their aggregate ids (a refused request stays among them: the thread says whether it waits)."""
        self.index.catch_up()
        return list(self._requested)

    def _fold(self, notification: Notification, event: DomainEventProtocol[UUID] | None) -> None:
        if notification.topic.endswith(".EnvironmentRequested"):
            self._requested.add(aggregate_id(notification))
        else:
            self._requested.discard(aggregate_id(notification))


class HookOperations:
    """Which environment started a hook under each operation id, and of which kind."""

    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch) -> None:
        self._app = app
        self._started: dict[str, tuple[UUID, HookKind]] = {}
        self.index = writers.log_index(app, watch, Environment, ("SetupStarted", "TeardownStarted"), self._fold)

    def started(self, operation_id: str) -> tuple[UUID, HookKind] | None:
        self.index.catch_up()
        return self._started.get(operation_id)

    def _fold(self, notification: Notification, saved: DomainEventProtocol[UUID] | None) -> None:
        event = self._app.mapper.to_domain_event(notification) if saved is None else saved
        assert isinstance(event, (Environment.SetupStarted, Environment.TeardownStarted))  # the index reads only these
        kind: HookKind = "setup" if isinstance(event, Environment.SetupStarted) else "teardown"
        self._started[event.operation_id] = (event.originator_id, kind)


@dataclass(frozen=True)
class LiveLimits:
    """How many environments that are not removed may live at once (SPEC 9)."""

    per_host: int = 10_000
    per_project: int = 1_000
    """Per project on one host; environments without a project count towards their host's limit only."""
    disk_bytes_per_project: int | None = None
    """The bytes one project's live environments on a host may take, as last measured, before
    its spawns are refused (SPEC 11, BB_MAX_DISK_BYTES_PER_PROJECT); None: no budget."""


class LiveEnvironments:
    """Every environment whose log does not end in Removed, and how many of them live on each host
    and in each project there, with the bytes their workspaces took when last measured: what
    recovery drives on, and what the live limits and the disk budget count."""

    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch) -> None:
        self._app = app
        self._places: dict[UUID, tuple[str, str | None]] = {}  # with its host and project
        self._on_host: Counter[str] = Counter()
        self._in_project: Counter[tuple[str, str]] = Counter()
        self._disk_bytes: dict[UUID, int] = {}  # of those measured since their workspace was made
        self._disk_in_project: Counter[tuple[str, str]] = Counter()
        self.index = writers.log_index(
            app, watch, Environment, ("Claimed", "Created", "DiskMeasured", "WorkspaceVanished", "Removed"), self._fold
        )

    def ids(self) -> list[UUID]:
        self.index.catch_up()
        return list(self._places)

    def on_host(self, host_id: str) -> int:
        self.index.catch_up()
        return self._on_host[host_id]

    def in_project(self, host_id: str, project_path: str) -> int:
        self.index.catch_up()
        return self._in_project[host_id, project_path]

    def disk_in_project(self, host_id: str, project_path: str) -> int:
        self.index.catch_up()
        return self._disk_in_project[host_id, project_path]

    def refuse_past(self, limits: LiveLimits, host_id: str, project_path: str | None, handed_on: UUID | None) -> None:
        """Refuse a new environment while its host, or its project there, has as many live ones as
        `limits` allow, or its project's workspaces there take more bytes than its budget, not
        counting the one `handed_on`, whose removal makes room for it."""
        self._refuse_past_count(limits, host_id, project_path, 1 if handed_on is not None else 0)
        if project_path is None or limits.disk_bytes_per_project is None:
            return
        used = self.disk_in_project(host_id, project_path) - (self._disk_bytes.get(handed_on, 0) if handed_on else 0)
        if used > limits.disk_bytes_per_project:
            raise LimitReached(
                f"project {project_path} has live environments on host {host_id} whose workspaces take "
                f"{used} bytes ({human_bytes(used)}) as last measured, more than "
                f"BB_MAX_DISK_BYTES_PER_PROJECT ({limits.disk_bytes_per_project} bytes, "
                f"{human_bytes(limits.disk_bytes_per_project)}) allows: remove one first"
            )

    def _refuse_past_count(self, limits: LiveLimits, host_id: str, project_path: str | None, handed_on: int) -> None:
        on_host = self.on_host(host_id)
        if on_host - handed_on >= limits.per_host:
            raise LimitReached(
                f"host {host_id} has {on_host} live environments, as many as "
                f"BB_MAX_LIVE_ENVIRONMENTS ({limits.per_host}) allows: remove one first"
            )
        in_project = self.in_project(host_id, project_path) if project_path is not None else 0
        if project_path is not None and in_project - handed_on >= limits.per_project:
            raise LimitReached(
                f"project {project_path} has {in_project} live environments on host {host_id}, as "
                f"many as BB_MAX_LIVE_ENVIRONMENTS_PER_PROJECT ({limits.per_project}) allows: "
                "remove one first"
            )

    def _fold(self, notification: Notification, event: DomainEventProtocol[UUID] | None) -> None:
        environment_id = aggregate_id(notification)
        if notification.topic.endswith(".Claimed"):
            claimed: Any = self._app.mapper.to_domain_event(notification) if event is None else event
            place = self._places[environment_id] = (claimed.host_id, claimed.project_path)
            self._count(place, 1)
            return
        if environment_id not in self._places:
            return
        # Any other event of these says the figure measured last is no longer the workspace's.
        self._measured(environment_id, None)
        if notification.topic.endswith(".DiskMeasured"):
            measured: Any = self._app.mapper.to_domain_event(notification) if event is None else event
            self._measured(environment_id, measured.disk_bytes)
        elif notification.topic.endswith(".Removed"):
            self._count(self._places.pop(environment_id), -1)

    def _measured(self, environment_id: UUID, disk_bytes: int | None) -> None:
        host_id, project_path = self._places[environment_id]
        before = self._disk_bytes.pop(environment_id, 0)
        if disk_bytes is not None:
            self._disk_bytes[environment_id] = disk_bytes
        if project_path is not None:
            self._disk_in_project[host_id, project_path] += (disk_bytes or 0) - before

    def _count(self, place: tuple[str, str | None], change: int) -> None:
        host_id, project_path = place
        self._on_host[host_id] += change
        if project_path is not None:
            self._in_project[host_id, project_path] += change


class WorktreeProjects:
    """By host, the projects git-worktree environments were claimed in, removed ones included: where
    worktrees and branches of bb's layout can be, for bb doctor to survey."""

    def __init__(self, app: Application[UUID], writers: Writers, watch: LogWatch) -> None:
        self._app = app
        self._projects: dict[str, set[str]] = {}
        self.index = writers.log_index(app, watch, Environment, ("Claimed",), self._fold)

    def by_host(self) -> dict[str, list[str]]:
        self.index.catch_up()
        return {host: sorted(projects) for host, projects in sorted(self._projects.items())}

    def _fold(self, notification: Notification, event: DomainEventProtocol[UUID] | None) -> None:
        claimed: Any = self._app.mapper.to_domain_event(notification) if event is None else event
        if claimed.provider_id == WORKTREE_PROVIDER_ID and claimed.project_path:
            self._projects.setdefault(claimed.host_id, set()).add(claimed.project_path)
