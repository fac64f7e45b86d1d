"""The API's edge: the endpoints of the `bb-environments` service, each a wire request decoded
(`bus/core/api_service.py`), translated into the handlers' query or command, answered by `handlers/api.py`
and translated back into its wire reply. The catalog documents these declarations.

A listing is paged, and a page is cut short where one more item would take its reply past the
connection's maximum payload, so no reply is too large to send whatever the documents hold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, TypeVar

import msgspec

from bb_environments.bus.core.api_service import ApiError, Endpoint
from bb_environments.bus.core.publications import PUBLICATIONS
from bb_environments.bus.wire.api_messages import (
    Accepted,
    EnvironmentAt,
    EnvironmentRef,
    Examine,
    HookOutputAt,
    HostRef,
    ListEnvironments,
    ListHistory,
    ListThreads,
    Next,
    Nothing,
    PoolRef,
    ProjectRef,
    RegisterHost,
    SecretRef,
    SetPool,
    SetSecret,
    Spawned,
    SpawnThread,
    ThreadRef,
)
from bb_environments.bus.wire.replica_messages import ReplicaPresence
from bb_environments.domain.errors import DomainError, UnknownEnvironment, UnknownThread
from bb_environments.domain.request_errors import InvalidInput, RequestError
from bb_environments.handlers.api import (
    Api,
    DoctorRequest,
    EnvironmentQuery,
    HistoryQuery,
    HookOutputQuery,
    Outcome,
    Page,
    ShowEnvironment,
    Spawn,
    ThreadQuery,
)
from bb_environments.handlers.commands import (
    ArchiveThread,
    CancelThreadMessage,
    ExistingEnvironment,
    Intent,
    NewEnvironment,
    UnarchiveThread,
)
from bb_environments.handlers.machines import Machines
from bb_environments.handlers.pool_use_cases import PoolState
from bb_environments.handlers.pools import Pools, PoolSetting
from bb_environments.handlers.secrets import Secrets
from bb_environments.projections.read_model import ReplayCounts
from bb_environments.projections.views import EnvironmentView, ThreadView
from bb_environments.providers.registry import ProviderDescription


class ProviderList(msgspec.Struct):
    providers: list[ProviderDescription]


class EnvironmentList(msgspec.Struct):
    """One page of environments, in id order."""

    environments: list[EnvironmentView]
    next: Next = None


class ThreadList(msgspec.Struct):
    """One page of threads, in id order."""

    threads: list[ThreadView]
    next: Next = None


class HistoryEvent(msgspec.Struct, rename="camel"):
    version: int
    type: Annotated[str, msgspec.Meta(description="The event's `type`, as docs/events.md names it.")]
    occurred_at: datetime
    duration_ms: Annotated[
        int | None,
        msgspec.Meta(description=("Milliseconds from this event to the environment's next one; null for its last.")),
    ]


class EnvironmentHistory(msgspec.Struct, rename="camel"):
    """One page of an environment's events, in log order."""

    environment_id: str
    events: list[HistoryEvent]
    next: Annotated[
        int | None, msgspec.Meta(description=("Null on the last page; otherwise send it as `after` for the next page."))
    ] = None


class DoctorOrphan(msgspec.Struct, rename="camel"):
    host_id: str
    path: Annotated[str, msgspec.Meta(description=("The canonical path; a branch's is `<repository>:<branch>`."))]
    kind: Annotated[
        str,
        msgspec.Meta(
            description=(
                "`workspace` (a directory under a provider's root), `worktree` (registered in a project repository) "
                "or `branch` (a `bb/` branch)."
            )
        ),
    ]
    saved_ref: Annotated[
        str | None,
        msgspec.Meta(
            description=(
                "Where `fix` saved the work that existed only there (`refs/bb/saved/orphan-<hash>` in its repository), "
                "or null."
            )
        ),
    ] = None
    failure: Annotated[
        str | None,
        msgspec.Meta(description=("Why `fix` kept it, in one sentence (the next run tries again), or null.")),
    ] = None


class DoctorMissing(msgspec.Struct, rename="camel"):
    environment_id: str
    host_id: str
    path: str


class DoctorReport(msgspec.Struct, rename="camel"):
    """What `doctor.run` found (with `fix`: and fixed, but for the orphans with a `failure`)."""

    orphans: list[DoctorOrphan]
    missing: list[DoctorMissing]


class HookOutputPage(msgspec.Struct, rename="camel"):
    """A page of a hook's output, cut after a whole line where one ends in it."""

    text: str
    next_offset: Annotated[int, msgspec.Meta(description="Send it as `offset` for the next page.")]
    more: Annotated[bool, msgspec.Meta(description="Whether another page follows (as the host keeps it now).")]


class RegisteredHost(msgspec.Struct, rename="camel"):
    host_id: str
    credentials: Annotated[
        str,
        msgspec.Meta(
            description=("The seed file (mode 0600) the host's agent connects with: copy it to that machine.")
        ),
    ]


class MachineView(msgspec.Struct, rename="camel"):
    id: str
    kind: str
    status: Annotated[
        str, msgspec.Meta(description=("`online`, `offline` (its agent not heard from for 15 s) or `never-seen`."))
    ]
    last_seen_at: datetime | None
    environments: Annotated[int, msgspec.Meta(description="Its environments that are not removed.")]
    own: Annotated[bool, msgspec.Meta(description="The service's own host.")] = False


class MachineList(msgspec.Struct):
    machines: list[MachineView]


class ReplicaList(msgspec.Struct):
    replicas: Annotated[
        list[ReplicaPresence],
        msgspec.Meta(
            description=(
                "The core replicas (`bb serve`) running on this NATS now: each writes its presence every 2 s, "
                "and one not heard from for 6 s is no longer listed."
            )
        ),
    ]


class HostRemoved(msgspec.Struct, rename="camel"):
    host_id: str
    status: str = "removed"


class PoolMembers(msgspec.Struct):
    ready: Annotated[int, msgspec.Meta(description="Set up, on the base's head, waiting for a thread.")]
    preparing: Annotated[int, msgspec.Meta(description="Being created or set up.")]
    stale: Annotated[int, msgspec.Meta(description="Prepared on another base, or failed: being removed.")]


class PoolPause(msgspec.Struct):
    reason: str
    at: datetime


class PoolView(msgspec.Struct, rename="camel"):
    id: str
    host_id: str
    project_path: str | None
    provider_id: str
    inputs: Any
    size: int
    members: PoolMembers
    base_commit: Annotated[str | None, msgspec.Meta(description="The base's head its host read last, or null.")]
    paused: PoolPause | None
    failures: Annotated[int, msgspec.Meta(description="Member setups failed in a row.")]

    @classmethod
    def of(cls, state: PoolState) -> PoolView:
        pool = state.pool
        return cls(
            id=str(pool.id),
            host_id=pool.host_id,
            project_path=pool.project_path,
            provider_id=pool.provider_id,
            inputs=pool.inputs,
            size=pool.size,
            members=PoolMembers(state.ready, state.preparing, state.stale),
            base_commit=pool.base_commit,
            paused=PoolPause(pool.paused_reason or "", pool.paused_at) if pool.paused_at is not None else None,
            failures=pool.failures,
        )


class PoolList(msgspec.Struct):
    pools: list[PoolView]


class SecretView(msgspec.Struct, rename="camel"):
    """A secret as anyone is told of it: its name and when it was set, never its value."""

    name: str
    set_at: datetime


class SecretSet(msgspec.Struct, rename="camel"):
    project_path: Annotated[str, msgspec.Meta(description="The project, in canonical form.")]
    name: str
    set_at: datetime


class SecretList(msgspec.Struct, rename="camel"):
    project_path: Annotated[str, msgspec.Meta(description="The project, in canonical form.")]
    secrets: list[SecretView]


class SecretRemoved(msgspec.Struct, rename="camel"):
    project_path: str
    name: str
    status: str = "removed"


Item = TypeVar("Item", EnvironmentView, ThreadView)
Listing = TypeVar("Listing", EnvironmentList, ThreadList)

REPLY_HEADROOM = 1024
"""Kept free below the maximum payload: a page's envelope and cursor, with room to spare."""


class ApiEdge:
    def __init__(
        self,
        api: Api,
        machines: Machines,
        secrets: Secrets,
        pools: Pools,
        max_payload: int,
        replicas: Callable[[], Awaitable[list[ReplicaPresence]]],
    ) -> None:
        """`max_payload`: the largest message the connection that answers may publish; `replicas`:
        the replicas present now."""
        self._api = api
        self._machines = machines
        self._secrets = secrets
        self._pools = pools
        self._max_payload = max_payload
        self._replicas = replicas

    def endpoints(self) -> list[Endpoint[Any]]:
        return [
            Endpoint("environments", "providers", Nothing, self.providers),
            Endpoint("environments", "list", ListEnvironments, self.list_environments),
            Endpoint("environments", "show", EnvironmentAt, self.show_environment),
            Endpoint("environments", "history", ListHistory, self.environment_history),
            Endpoint("environments", "output", HookOutputAt, self.hook_output),
            Endpoint("environments", "delete", EnvironmentRef, self.delete_environment),
            Endpoint("environments", "retry", EnvironmentRef, self.retry_environment),
            Endpoint("threads", "spawn", SpawnThread, self.spawn_thread),
            Endpoint("threads", "list", ListThreads, self.list_threads),
            Endpoint("threads", "archive", ThreadRef, self.archive_thread),
            Endpoint("threads", "unarchive", ThreadRef, self.unarchive_thread),
            Endpoint("threads", "cancel", ThreadRef, self.cancel_thread),
            Endpoint("events", "replay", Nothing, self.replay),
            Endpoint("doctor", "run", Examine, self.doctor),
            Endpoint("machines", "register", RegisterHost, self.register_host),
            Endpoint("machines", "list", Nothing, self.list_machines),
            Endpoint("machines", "remove", HostRef, self.remove_host),
            Endpoint("pools", "set", SetPool, self.set_pool),
            Endpoint("pools", "list", Nothing, self.list_pools),
            Endpoint("pools", "resume", PoolRef, self.resume_pool),
            Endpoint("secrets", "set", SetSecret, self.set_secret),
            Endpoint("secrets", "list", ProjectRef, self.list_secrets),
            Endpoint("secrets", "remove", SecretRef, self.remove_secret),
            Endpoint("replicas", "list", Nothing, self.list_replicas),
        ]

    async def set_secret(self, request: SetSecret) -> SecretSet:
        project, entry = await self._secrets.set(request.project_path, request.name, request.value)
        return SecretSet(project, entry.name, entry.set_at)

    async def list_secrets(self, request: ProjectRef) -> SecretList:
        project, entries = await self._secrets.list(request.project_path)
        return SecretList(project, [SecretView(entry.name, entry.set_at) for entry in entries])

    async def remove_secret(self, request: SecretRef) -> SecretRemoved:
        project = await self._secrets.remove(request.project_path, request.name)
        return SecretRemoved(project, request.name)

    async def set_pool(self, request: SetPool) -> PoolView:
        setting = PoolSetting(request.project_path, request.provider_id, request.size, request.host_id, request.inputs)
        return PoolView.of(await self._pools.set(setting))

    async def list_pools(self, _: Nothing) -> PoolList:
        return PoolList([PoolView.of(state) for state in await self._pools.list()])

    async def resume_pool(self, request: PoolRef) -> PoolView:
        return PoolView.of(await self._pools.resume(request.pool_id))

    async def hook_output(self, request: HookOutputAt) -> HookOutputPage:
        page = await self._api.hook_output(
            HookOutputQuery(request.environment_id, request.operation_id, request.offset)
        )
        return HookOutputPage(page.text, page.next_offset, page.more)

    async def register_host(self, request: RegisterHost) -> RegisteredHost:
        registered = await self._machines.register(request.host_id, request.rotate)
        return RegisteredHost(registered.host_id, registered.credentials)

    async def list_machines(self, _: Nothing) -> MachineList:
        return MachineList(
            [
                MachineView(m.id, "host", m.status, m.last_seen_at, m.environments, m.own)
                for m in await self._machines.machines()
            ]
        )

    async def list_replicas(self, _: Nothing) -> ReplicaList:
        return ReplicaList(sorted(await self._replicas(), key=lambda r: r.replica_id))

    async def remove_host(self, request: HostRef) -> HostRemoved:
        await self._machines.remove(request.host_id)
        return HostRemoved(request.host_id)

    async def providers(self, _: Nothing) -> ProviderList:
        return ProviderList(await self._api.providers())

    async def list_environments(self, request: ListEnvironments) -> EnvironmentList:
        page = await self._api.list_environments(
            EnvironmentQuery(
                limit=request.limit,
                status=request.status,
                provider_id=request.provider,
                include_removed=request.include_removed,
                after=request.after,
            )
        )
        return self._fitted(page, lambda items, after: EnvironmentList(items, after))

    async def show_environment(self, request: EnvironmentAt) -> EnvironmentView:
        return await self._api.show_environment(
            ShowEnvironment(request.environment_id, request.min_position, request.at)
        )

    async def environment_history(self, request: ListHistory) -> EnvironmentHistory:
        page = await self._api.environment_history(HistoryQuery(request.environment_id, request.limit, request.after))
        events = [
            HistoryEvent(e.version, PUBLICATIONS[e.event_class].type, e.occurred_at, e.duration_ms) for e in page.items
        ]
        # An event's entry is a hundred bytes or so: at least one always fits.
        sent = events[: max(1, _fitting(events, self._max_payload - REPLY_HEADROOM))]
        more = page.more or len(sent) < len(events)
        return EnvironmentHistory(request.environment_id, sent, sent[-1].version if more else None)

    async def delete_environment(self, request: EnvironmentRef) -> Accepted:
        return _accepted(await self._api.delete_environment(request.environment_id))

    async def retry_environment(self, request: EnvironmentRef) -> Accepted:
        return _accepted(await self._api.retry_environment(request.environment_id))

    async def spawn_thread(self, request: SpawnThread) -> Spawned:
        spawned = await self._api.spawn_thread(
            Spawn(
                _intent(request),
                thread_id=request.thread_id,
                project_path=request.project_path,
                host_id=request.host_id,
                parent_thread_id=request.parent_thread_id,
                prompt=request.prompt,
            )
        )
        return Spawned(spawned.thread_id, spawned.environment_id, spawned.status, spawned.position)

    async def list_threads(self, request: ListThreads) -> ThreadList:
        page = await self._api.list_threads(
            ThreadQuery(limit=request.limit, environment_id=request.environment_id, after=request.after)
        )
        return self._fitted(page, lambda items, after: ThreadList(items, after))

    async def archive_thread(self, request: ThreadRef) -> Accepted:
        return _accepted(await self._api.thread_command(ArchiveThread(request.thread_id)))

    async def unarchive_thread(self, request: ThreadRef) -> Accepted:
        return _accepted(await self._api.thread_command(UnarchiveThread(request.thread_id)))

    async def cancel_thread(self, request: ThreadRef) -> Accepted:
        return _accepted(await self._api.thread_command(CancelThreadMessage(request.thread_id)))

    async def replay(self, _: Nothing) -> ReplayCounts:
        return await self._api.replay()

    async def doctor(self, request: Examine) -> DoctorReport:
        found = await self._api.doctor(DoctorRequest(fix=request.fix))
        return DoctorReport(
            [
                DoctorOrphan(orphan.host_id, orphan.path, orphan.kind, orphan.saved_ref, orphan.failure)
                for orphan in found.orphans
            ],
            [DoctorMissing(missing.environment_id, missing.host_id, missing.path) for missing in found.missing],
        )

    def _fitted(self, page: Page[Item], listing: Callable[[list[Item], str | None], Listing]) -> Listing:
        """The page as its reply, cut before the first item that would take it past the maximum
        payload; `next` names the last item sent whenever anything follows it."""
        items = page.items[: _fitting(page.items, self._max_payload - REPLY_HEADROOM)]
        if not items and page.items:
            raise ApiError(
                "failed",
                f"the document of {page.items[0].id} alone exceeds the maximum payload of {self._max_payload} bytes",
            )
        more = page.more or len(items) < len(page.items)
        return listing(items, items[-1].id if more else None)


def _fitting(items: Sequence[msgspec.Struct], budget: int) -> int:
    """How many of the items, from the first, fit in `budget` bytes as a JSON array."""
    used = 2
    for count, item in enumerate(items):
        used += len(msgspec.json.encode(item)) + 1
        if used > budget:
            return count
    return len(items)


def _intent(request: SpawnThread) -> Intent | None:
    """Where the spawn asks its thread to run; a request naming two places, or inputs for no
    provider, is refused here, as it has no meaning for the handlers."""
    if request.environment_inputs is not None and request.environment_provider is None:
        raise InvalidInput("environment inputs were given without an environment provider; add --environment-provider")
    if request.environment_provider and request.environment_id:
        raise InvalidInput("give either an environment provider or an existing environment, not both")
    if request.environment_provider:
        return NewEnvironment(request.environment_provider, None, request.environment_inputs)
    if request.environment_id:
        return ExistingEnvironment(request.environment_id)
    return None


def _accepted(outcome: Outcome) -> Accepted:
    return Accepted(outcome.environment_id, outcome.status, outcome.position)


def translate_error(error: Exception) -> ApiError | None:
    if isinstance(error, ApiError):
        return error
    if isinstance(error, RequestError):
        return ApiError(error.code, error.message)
    if isinstance(error, (UnknownEnvironment, UnknownThread)):
        return ApiError("not_found", str(error))
    if isinstance(error, DomainError):
        return ApiError("refused", str(error))
    return None
