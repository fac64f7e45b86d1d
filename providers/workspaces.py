"""The workspaces of this machine: the workspace verbs of the core's `Host` port (handlers/ports.py),
in process (hooks/local_host.py adds the hooks).

Each provider call that may take long (planning, create, remove, pause, resume) runs on a worker
thread, so the core's loop goes on meanwhile, and its reports go into the environment's
transcript as they come. A provider that raises or answers nonsense fails its call, never the
service. Each provider keeps what it needs under its own directory of the data dir.

Nothing a hook started outlives its environment: a removal first ends every process the
environment's hooks left (providers/host/containment.py), then hands the workspace back from the
BB_WORKSPACE_USER that owned it (providers/host/workspace_user.py), and only then asks the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from bb_environments.providers.contract import (
    BindContext,
    BindFailed,
    CreateContext,
    Created,
    CreateFailed,
    CreateResult,
    EnvironmentProvider,
    ProjectContext,
    ProviderMissing,
    RemoveContext,
    Removed,
    RemoveFailed,
    RemoveResult,
    Transcript,
    can_pool,
    is_pausable,
    is_surveyed,
)
from bb_environments.providers.host.attempt_records import BegunAttempts, RemovedAttempts
from bb_environments.providers.host.containment import Containment
from bb_environments.providers.host.crash_points import crash_point
from bb_environments.providers.host.disk_usage import tree_bytes
from bb_environments.providers.host.listening import ListeningPorts
from bb_environments.providers.host.workspace_user import WorkspaceUser
from bb_environments.providers.planning import (
    canonical_path,
    canonical_project,
    check_available,
    check_within_roots,
    checked_project,
    claimed_path,
    decode_inputs,
    member_inputs,
    plan_path,
    read_base_head,
)
from bb_environments.providers.registry import ProviderDescription, ProviderProfile, ProviderRegistry, safe_availability
from bb_environments.providers.workspace_messages import (
    BindRequest,
    BindResult,
    Bound,
    CreateRequest,
    DiskUsage,
    DiskUsageRequest,
    LeftoverRemoval,
    NotBound,
    Paused,
    PauseFailed,
    PauseResult,
    Plan,
    PlanRequest,
    RemoveRequest,
    ResourceRequest,
    Resumed,
    ResumeFailed,
    ResumeResult,
    Survey,
    SurveyRequest,
)

log = logging.getLogger(__name__)

CLEANUPS_AT_ONCE = 4


def provider_dir(data_dir: Path, provider_id: str) -> Path:
    """The directory that belongs to provider `provider_id` alone."""
    return data_dir / "providers" / provider_id


@dataclass
class _TranscriptReporter:
    """A provider's `report`, writing its steps and logs into the environment's transcript."""

    transcript: Transcript
    environment_id: str
    source: str

    def step(self, text: str) -> None:
        self.transcript.line(self.environment_id, "step", self.source, text)

    def log(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            self.transcript.line(self.environment_id, "output", self.source, line)


class LocalWorkspaces:
    """The registry's providers, run on this machine for whichever host a call names: the host
    whose agent runs here, or, for the core's own (cloud) providers, any host an environment names."""

    def __init__(
        self,
        registry: ProviderRegistry,
        data_dir: Path,
        transcript: Transcript,
        *,
        earlier_data_dir: Path | None = None,
        containment: Containment | None = None,
        workspace_user: WorkspaceUser | None = None,
    ) -> None:
        """`earlier_data_dir`: where this host's providers kept their workspaces before `data_dir`
        (a root moved by BB_AGENT_ROOT), whose workspaces are removed and surveyed there;
        `containment`: where this host's hooks keep what they start (None: no hook runs here);
        `workspace_user`: who owns the workspaces the providers make (None: this process's user)."""
        self._registry = registry
        self._containment = containment
        self._workspace_user = workspace_user
        self._data_dir = data_dir
        self._earlier_data_dir = earlier_data_dir
        self._transcript = transcript
        self._profiles = registry.profiles()
        self._cleanup_slots = asyncio.Semaphore(CLEANUPS_AT_ONCE)
        self._host_slots: dict[str, asyncio.Semaphore] = {}
        self._listening = ListeningPorts()
        self._removed = RemovedAttempts(data_dir / "removed-attempts")
        self._begun = BegunAttempts(data_dir / "begun-attempts")
        self._changing: dict[str, asyncio.Lock] = {}
        self._changers: Counter[str] = Counter()

    def profiles(self, host_id: str) -> Mapping[str, ProviderProfile]:
        return self._profiles

    async def providers(self, host_id: str) -> list[ProviderDescription]:
        def describe() -> list[ProviderDescription]:
            return [
                ProviderDescription.of(
                    profile, safe_availability(provider, self._context(provider, host_id, None, None))
                )
                for profile, provider in ((p, self._provider(p.id)) for p in self._profiles.values())
            ]

        return await asyncio.to_thread(describe)

    async def inputs(self, host_id: str, provider_id: str, inputs: Any) -> Any:
        return msgspec.to_builtins(decode_inputs(self._provider(provider_id), inputs))

    async def canonical_project(self, host_id: str, project_path: str | None) -> str | None:
        return canonical_project(project_path)

    async def plan(self, request: PlanRequest) -> Plan:
        provider = self._provider(request.provider_id)
        data_dir = os.path.realpath(self._data_dir)
        project = checked_project(provider, request.project_path, data_dir)
        # Before git runs in it: whoever holds the publisher seed names the project, and so whose hooks run.
        check_within_roots(project, request.project_roots)
        inputs = decode_inputs(provider, request.inputs)
        context = self._context(provider, request.host_id, project, inputs)
        check_available(provider, context)
        if request.member:
            context = self._context(
                provider, request.host_id, project, member_inputs(provider, context, request.path_key)
            )
        planned, shares = await asyncio.to_thread(plan_path, provider, context, request.path_key)
        head = None
        if (request.base_head or request.member) and can_pool(provider):
            head = await asyncio.to_thread(read_base_head, provider, context, request.member)
        return Plan(
            project_path=project,
            inputs=msgspec.to_builtins(context.inputs),
            claimed_path=claimed_path(planned, data_dir),
            shares_claimed_path=shares,
            listening=await self._listening.now(),
            base_head=head,
        )

    async def bind(self, request: BindRequest) -> BindResult:
        """A pool's member bound to a thread: its provider gives the workspace the thread's identity."""
        provider = self._provider(request.provider_id)
        if not can_pool(provider):
            return NotBound(f"the {provider.id!r} provider does not pool environments")
        context = BindContext(
            host_id=request.host_id,
            project_path=request.project_path,
            inputs=_typed_inputs(provider, request.inputs),
            data_dir=str(provider_dir(self._data_dir, provider.id)),
            path=request.path,
            resource=request.resource,
            path_key=request.path_key,
        )
        try:
            resource = await asyncio.to_thread(provider.bind, context)
        except BindFailed as failed:
            return NotBound(str(failed))
        crash_point("bind-renamed")  # done on the host, not yet answered: asked again, it is found done
        return Bound(resource)

    async def planned_path(self, request: PlanRequest) -> str | None:
        provider = self._provider(request.provider_id)
        inputs = decode_inputs(provider, request.inputs)
        context = self._context(provider, request.host_id, request.project_path, inputs)
        planned = await asyncio.to_thread(provider.planned_path, context, request.path_key)
        return canonical_path(planned) if planned else None

    async def create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        """Refused once a removal of the attempt began here (see providers/host/attempt_records.py);
        a removal asked meanwhile waits for the create to end, then removes what it made."""
        async with self._one_change_at_a_time(request.environment_id):
            try:
                removed = await asyncio.to_thread(self._removed.removed, request.environment_id, request.attempt)
                if not removed:
                    await asyncio.to_thread(self._begun.record, request.environment_id, request.attempt)
            except (ValueError, OSError) as error:
                return CreateFailed("terminal", f"this host cannot tell whether the attempt was removed: {error}")
            if removed:
                return CreateFailed(
                    "terminal",
                    f"attempt {request.attempt} of environment {request.environment_id} was removed on this host; "
                    "its workspace is not made again",
                )
            return await self._create(request, cancelled)

    async def _create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        provider = self._provider(request.provider_id)
        data_dir = provider_dir(self._data_dir, provider.id)
        data_dir.mkdir(parents=True, exist_ok=True)
        context = CreateContext(
            host_id=request.host_id,
            project_path=request.project_path,
            inputs=_typed_inputs(provider, request.inputs),
            data_dir=str(data_dir),
            thread_id=request.thread_id,
            path_key=request.path_key,
            attempt=request.attempt,
            previous=request.previous,
            environment_id=request.environment_id,
            report=_TranscriptReporter(self._transcript, request.environment_id, provider.id),
            cancelled=cancelled,
        )
        result = await asyncio.to_thread(_call_create, provider, context)
        if isinstance(result, Created):
            result = msgspec.structs.replace(result, path=canonical_path(result.path))
            if self._workspace_user is not None and result.owns_path and is_surveyed(provider):
                try:
                    await asyncio.to_thread(
                        self._workspace_user.hand_over,
                        Path(result.path),
                        request.project_path,
                        Path(os.path.realpath(self._data_dir)),
                    )
                except OSError as error:
                    return CreateFailed(
                        "terminal", f"the workspace could not be handed to user {self._workspace_user.name}: {error}"
                    )
        return result

    async def remove(self, request: RemoveRequest, cancelled: threading.Event) -> RemoveResult:
        """At most CLEANUPS_AT_ONCE removals run, one per host, so a stuck host blocks only itself."""
        provider = self._provider(request.provider_id)
        host_slot = self._host_slots.setdefault(request.host_id, asyncio.Semaphore(1))
        async with self._one_change_at_a_time(request.environment_id), host_slot, self._cleanup_slots:
            context = RemoveContext(
                host_id=request.host_id,
                data_dir=str(self._provider_dir_of(provider.id, request.path)),
                project_path=request.project_path,
                inputs=_typed_inputs(provider, request.inputs),
                path=request.path,
                path_key=request.path_key,
                attempt=request.attempt,
                resource=request.resource,
                environment_id=request.environment_id,
                report=_TranscriptReporter(self._transcript, request.environment_id, provider.id),
                cancelled=cancelled,
                unbound_member=request.unbound_member,
            )
            ended = None if request.removal_attempt else request.attempt
            return await asyncio.to_thread(self._remove, provider, context, ended)

    def _remove(self, provider: EnvironmentProvider, context: RemoveContext, ended: int | None) -> RemoveResult:
        """`ended`: the attempt a cleanup ends, None for the environment's removal."""
        try:
            if ended is not None and self._begun.superseded(context.environment_id, ended):
                log.info(
                    "the cleanup of attempt %s of environment %s came after a later attempt began here: "
                    "it was done before that one began, and is not done again",
                    ended,
                    context.environment_id,
                )
                return Removed()
            self._removed.record(context.environment_id, ended)
        except (ValueError, OSError) as error:
            return RemoveFailed(f"the removal could not be recorded before anything is deleted: {error}")
        if self._containment is not None and not self._containment.end(context.environment_id):
            return RemoveFailed(
                "processes started by the environment's hooks are still running; "
                "the workspace is kept until they have ended"
            )
        if self._workspace_user is not None and context.path is not None and is_surveyed(provider):
            try:
                self._workspace_user.take_back(Path(context.path), context.project_path)
            except OSError as error:
                return RemoveFailed(
                    f"the workspace could not be taken back from user {self._workspace_user.name}: {error}"
                )
        return _call_remove(provider, context)

    async def idle_pause_due(self, host_id: str, provider_id: str, last_activity: datetime, now: datetime) -> bool:
        provider = self._provider(provider_id)
        if not is_pausable(provider):
            return False
        data_dir = str(provider_dir(self._data_dir, provider.id))
        return await asyncio.to_thread(provider.idle_pause_due, last_activity, now, data_dir)

    async def pause(
        self, request: ResourceRequest, checkpoint: Callable[[dict[str, Any]], Coroutine[Any, Any, object]]
    ) -> PauseResult:
        """`checkpoint` makes the resumable resource durable; the provider calls it before it stops anything."""
        provider = self._provider(request.provider_id)
        if not is_pausable(provider):
            return PauseFailed(_cannot_pause(provider))
        loop = asyncio.get_running_loop()

        def durable(resource: dict[str, Any]) -> None:
            asyncio.run_coroutine_threadsafe(checkpoint(resource), loop).result()

        try:
            return Paused(await asyncio.to_thread(provider.pause, request.resource, durable))
        except Exception as error:
            return PauseFailed(str(error))

    async def resume(self, request: ResourceRequest) -> ResumeResult:
        provider = self._provider(request.provider_id)
        if not is_pausable(provider):
            return ResumeFailed(_cannot_pause(provider))
        try:
            return Resumed(await asyncio.to_thread(provider.resume, request.resource))
        except Exception as error:
            return ResumeFailed(str(error))

    async def survey(self, request: SurveyRequest) -> Survey:
        """Asks each provider that keeps its workspaces as directories here what exists; a
        provider that fails to answer fails the survey (a partial one would hide leftovers)."""

        def look() -> Survey:
            found = []
            local = set()
            for provider_id in self._registry.ids():
                provider = self._provider(provider_id)
                if is_surveyed(provider):
                    local.add(provider_id)
                    for root in self._roots():
                        found.extend(provider.leftovers(str(provider_dir(root, provider_id)), request.repos))
            absent = [
                path for provider_id, path in request.workspaces if provider_id in local and not os.path.lexists(path)
            ]
            return Survey(found, absent)

        return await asyncio.to_thread(look)

    async def disk_usage(self, request: DiskUsageRequest) -> DiskUsage:
        """The size of each workspace asked about that is a directory of a provider keeping its
        workspaces here, measured one after another on a worker thread (off the core's loop)."""

        def measure() -> DiskUsage:
            sizes = {}
            for provider_id, path in request.workspaces:
                if self._keeps_here(provider_id, path) and (size := tree_bytes(path)) is not None:
                    sizes[path] = size
            return DiskUsage(sizes)

        return await asyncio.to_thread(measure)

    async def remove_leftover(self, request: LeftoverRemoval) -> RemoveResult:
        """Saves its work, then removes it, unless a live environment's record covers it now."""
        leftover = request.leftover
        if request.protected.covers(leftover):
            return RemoveFailed(f"{leftover.path} is a live environment's now; it is kept")
        provider = self._provider(leftover.provider_id)
        if not is_surveyed(provider):
            return RemoveFailed(f"the {provider.id!r} provider keeps no workspaces on this host to remove")
        data_dir = str(self._provider_dir_of(provider.id, leftover.path))
        try:
            return Removed(await asyncio.to_thread(provider.remove_leftover, data_dir, leftover))
        except Exception as error:
            return RemoveFailed(f"{leftover.path} is kept: {error}")

    @contextlib.asynccontextmanager
    async def _one_change_at_a_time(self, environment_id: str) -> AsyncIterator[None]:
        """The environment's creates and removals one after the other; its lock forgotten when none waits."""
        lock = self._changing.setdefault(environment_id, asyncio.Lock())
        self._changers[environment_id] += 1
        try:
            async with lock:
                yield
        finally:
            self._changers[environment_id] -= 1
            if not self._changers[environment_id]:
                del self._changers[environment_id], self._changing[environment_id]

    def _roots(self) -> list[Path]:
        return [self._data_dir, *([self._earlier_data_dir] if self._earlier_data_dir else [])]

    def _provider_dir_of(self, provider_id: str, path: str | None) -> Path:
        """The provider's directory that holds `path`: the earlier one for a workspace made there."""
        if self._earlier_data_dir is not None and path is not None:
            earlier = provider_dir(self._earlier_data_dir, provider_id)
            if Path(path).is_relative_to(earlier):
                return earlier
        return provider_dir(self._data_dir, provider_id)

    def _keeps_here(self, provider_id: str, path: str) -> bool:
        """`path` lies in the directory of a provider that keeps its workspaces on this host: a
        request naming any other path (the bus's messages are untrusted) measures nothing."""
        provider = self._registry.get(provider_id)
        if provider is None or not is_surveyed(provider) or not os.path.isabs(path):
            return False
        home = self._provider_dir_of(provider_id, path)
        return any(Path(os.path.normpath(path)).is_relative_to(directory) for directory in (home, home.resolve()))

    def _provider(self, provider_id: str) -> EnvironmentProvider:
        provider = self._registry.get(provider_id)
        if provider is None:
            raise ProviderMissing(f"the environment provider {provider_id!r} is not registered")
        return provider

    def _context(
        self, provider: EnvironmentProvider, host_id: str, project_path: str | None, inputs: Any
    ) -> ProjectContext:
        """What the provider learns of a request; creating its data dir is left to create."""
        data_dir = str(provider_dir(self._data_dir, provider.id))
        return ProjectContext(host_id=host_id, project_path=project_path, inputs=inputs, data_dir=data_dir)


def _cannot_pause(provider: EnvironmentProvider) -> str:
    return f"the {provider.id!r} provider does not pause environments"


def _typed_inputs(provider: EnvironmentProvider, inputs: object) -> object:
    return None if provider.inputs_type is None else msgspec.convert(inputs, provider.inputs_type)


def _call_create(provider: EnvironmentProvider, context: CreateContext) -> CreateResult:
    try:
        result = provider.create(context)
    except Exception as error:
        return CreateFailed("terminal", f"the {provider.id!r} provider failed: {error}")
    if not isinstance(result, (Created, CreateFailed)):
        return CreateFailed("terminal", f"the {provider.id!r} provider returned an invalid create result")
    return result


def _call_remove(provider: EnvironmentProvider, context: RemoveContext) -> RemoveResult:
    try:
        result = provider.remove(context)
    except Exception as error:
        return RemoveFailed(f"the {provider.id!r} provider failed to remove: {error}")
    if not isinstance(result, (Removed, RemoveFailed)):
        return RemoveFailed(f"the {provider.id!r} provider returned an invalid remove result")
    return result
