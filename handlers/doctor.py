"""`bb doctor`: what each host holds of bb's layout, compared with what the log records (SPEC §8.2).

Each host lists what exists there (the Host port's `survey`, answered where the host's
work runs); the comparison is the core's, against the log: an orphan is something found that no
environment not yet removed records (its workspace or claimed path, its path key, its branch),
bar the branch a git-worktree environment's removal left to the user on purpose, and a missing workspace is one a settled environment records that its host no longer has.

The fix removes each orphan on its host after saving its work there (the host checks the
records it is sent again, just before it removes anything), then records each missing workspace
on its environment. Each step is safe to repeat: a kill leaves what the next doctor finishes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from uuid import UUID

from bb_environments.domain.environment import Environment
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.handlers.application import Environments
from bb_environments.handlers.ports import Hosts
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store
from bb_environments.providers.contract import Leftover, RemoveFailed
from bb_environments.providers.workspace_messages import LeftoverRemoval, Protected, Survey, SurveyRequest
from bb_environments.providers.worktree_survey import BRANCH_PREFIX, branch_place
from bb_environments.providers.worktree_survey import PROVIDER_ID as WORKTREE_PROVIDER_ID


@dataclass(frozen=True)
class Orphan:
    host_id: str
    leftover: Leftover
    saved_ref: str | None = None
    """Where `--fix` saved its work before removing it (None: nothing to save, or not fixed)."""
    failure: str | None = None
    """Why `--fix` kept it, in one sentence (None: removed, or not asked to fix)."""

    @property
    def path(self) -> str:
        return self.leftover.path

    @property
    def kind(self) -> str:
        return self.leftover.kind


@dataclass(frozen=True)
class Missing:
    environment_id: str
    host_id: str
    path: str


@dataclass(frozen=True)
class Findings:
    orphans: list[Orphan] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)


def protected_by(environments: Iterable[Environment]) -> Protected:
    """Everything `environments` record on any host: doctor never touches what one of them records."""
    paths: set[str] = set()
    branches: set[str] = set()
    keys: set[tuple[str, str]] = set()
    for environment in environments:
        paths.update(path for path in (environment.path, environment.claimed_path) if path)
        keys.add((environment.provider_id, environment.path_key))
        if environment.provider_id == WORKTREE_PROVIDER_ID and environment.project_path:
            branches.update(branch_place(environment.project_path, branch) for branch in _branches(environment))
    return Protected(sorted(paths), sorted(branches), sorted(keys))


def compare(host_id: str, survey: Survey, environments: list[Environment]) -> Findings:
    """The host's orphans and missing workspaces, given what it holds and every environment not removed."""
    protected = protected_by(environments)
    absent = set(survey.absent)
    return Findings(
        orphans=[Orphan(host_id, leftover) for leftover in survey.found if not protected.covers(leftover)],
        missing=[
            Missing(str(environment.id), host_id, environment.path)
            for environment in environments
            if environment.host_id == host_id
            and environment.workspace_may_vanish
            and environment.path in absent
            and environment.path is not None
        ],
    )


class Doctor:
    def __init__(
        self,
        store: Store,
        hosts: Hosts,
        provisioner: Provisioner,
        host_id: str,
        known_hosts: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        """`known_hosts`: the hosts environments may be placed on (default: this service's own)."""
        self._store = store
        self._app = store.app
        self._hosts = hosts
        self._provisioner = provisioner
        self._host_id = host_id
        self._known_hosts = known_hosts

    async def examine(self) -> Findings:
        """Every host's findings: this service's own host (while an agent serves it: a replica with
        --no-agent is no machine), and every host the log places work on.
        Raises HostUnavailable when a host does not answer (its findings would be unknown)."""
        environments = await self._store.run(self._app.live_environments)
        projects = await self._store.run(self._app.worktree_projects)
        own = [self._host_id] if self._known_hosts is None or self._host_id in await self._known_hosts() else []
        hosts = sorted({*own, *projects, *(environment.host_id for environment in environments)})
        orphans: dict[tuple[str, str], Orphan] = {}
        missing: list[Missing] = []
        for host_id in hosts:
            workspaces = [
                (environment.provider_id, environment.path)
                for environment in environments
                if environment.host_id == host_id and environment.workspace_may_vanish and environment.path
            ]
            survey = await self._hosts.host(host_id).survey(
                SurveyRequest(host_id, projects.get(host_id, []), workspaces)
            )
            found = compare(host_id, survey, environments)
            # Host ids that one machine answers for (an earlier BB_HOST_ID) find the same things.
            for orphan in found.orphans:
                orphans.setdefault((orphan.path, orphan.kind), orphan)
            missing.extend(found.missing)
        kept = await self._store.run(_kept_by_removals, self._app, [o.leftover for o in orphans.values()])
        return Findings([o for o in orphans.values() if o.leftover not in kept], missing)

    async def fix(self) -> Findings:
        """Examine, then remove each orphan (its work saved first) and record each missing workspace."""
        found = await self.examine()
        fixed: list[Orphan] = []
        for orphan in found.orphans:
            # What the log records now, not when the host was surveyed: a spawn may have claimed it since.
            protected = protected_by(await self._store.run(self._app.live_environments))
            result = await self._hosts.host(orphan.host_id, orphan.leftover.provider_id).remove_leftover(
                LeftoverRemoval(orphan.host_id, orphan.leftover, protected)
            )
            if isinstance(result, RemoveFailed):
                fixed.append(Orphan(orphan.host_id, orphan.leftover, failure=result.message))
            else:
                fixed.append(Orphan(orphan.host_id, orphan.leftover, result.saved_ref))
        for missing in found.missing:
            environment = await self._store.run(
                self._app.record_workspace_vanished, UUID(missing.environment_id), missing.path
            )
            await self._provisioner.drive(environment.id, environment)
        return Findings(fixed, found.missing)


def _kept_by_removals(app: Environments, leftovers: list[Leftover]) -> list[Leftover]:
    """The `bb/<path key>` branches that the removal of a git-worktree environment kept: it had a
    worktree of its own (a failed create's branch was never handed to a thread), and its removal
    saved what the worktree held beyond the branch (`savedRef`) and left the branch, with the
    thread's commits, to the user. A git-worktree path key is its thread's id (a pool's member,
    bound to a thread, has the branch of the thread's key beside its own path key)."""
    kept = []
    for leftover in leftovers:
        if leftover.kind != "branch" or leftover.branch is None or not leftover.branch.startswith(BRANCH_PREFIX):
            continue
        key = leftover.branch.removeprefix(BRANCH_PREFIX)
        if any(
            environment.provider_id == WORKTREE_PROVIDER_ID
            and environment.status == EnvironmentStatus.REMOVED
            and environment.owns_path
            and key in (environment.path_key, environment.thread_path_key)  # a pool's member takes its thread's
            and environment.project_path is not None
            and leftover.path == branch_place(environment.project_path, leftover.branch)
            for environment in app.environments_of_thread(key)
        ):
            kept.append(leftover)
    return kept


def _branches(environment: Environment) -> set[str]:
    """The branches a git-worktree environment works on, or will: its recorded one, the one its
    inputs name, and the default `bb/<path key>`."""
    branches = {BRANCH_PREFIX + environment.path_key}
    recorded = (environment.resource or {}).get("branch")
    if isinstance(recorded, str):
        branches.add(recorded)
    chosen = environment.inputs.get("branch") if isinstance(environment.inputs, dict) else None
    if isinstance(chosen, dict) and isinstance(chosen.get("name"), str):
        branches.add(chosen["name"])
    return branches
