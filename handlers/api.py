"""What each API request does: queries read the projections, commands go through the store.

The handlers take the queries and commands declared here and answer with values declared here (or
the read model's views); the bus decodes its wire requests into them and encodes the answers
(`bus/core/api_endpoints.py`), so no wire struct reaches this module.

A command's outcome carries `position`, the log position of its last event; a query may pass it as
`min_position` and is answered only once the read model has caught up (read-your-writes).

Every id a request names is checked for its format before the store is asked anything, so a
malformed one is `invalid_input` (exit 2), never `not_found` or a write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar
from uuid import UUID, uuid4

import msgspec

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import DomainError, UnknownEnvironment
from bb_environments.domain.ids import is_environment_id_prefix, quoted
from bb_environments.domain.request_errors import InvalidInput, NotFound, RequestError, Unavailable
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.domain.thread import Thread
from bb_environments.handlers.commands import (
    ArchiveThread,
    CancelThreadMessage,
    ExistingEnvironment,
    Intent,
    NewEnvironment,
    RegisterThread,
    UnarchiveThread,
)
from bb_environments.handlers.doctor import Doctor, Findings
from bb_environments.handlers.indexed_application import GraceLookup
from bb_environments.handlers.placement import Placer, check_environment_id, check_host_id, check_thread_id
from bb_environments.handlers.ports import Hosts, HostUnavailable
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.projections.history import EnvironmentHistory, LoggedEvent, NotRecorded
from bb_environments.projections.read_model import ReadModel, ReplayCounts
from bb_environments.projections.views import EnvironmentView, ThreadView, ViewPage
from bb_environments.providers.contract import Availability
from bb_environments.providers.registry import ProviderDescription

T = TypeVar("T")

MAX_INPUTS_NESTING = 32
"""Inputs are kept in the log and decoded again whenever their thread is loaded, by decoders that
recurse; no provider's inputs come near this."""


@dataclass(frozen=True)
class EnvironmentQuery:
    """A page of environments, in id order, after the environment `after` (None: from the first)."""

    limit: int
    status: EnvironmentStatus | None = None
    provider_id: str | None = None
    include_removed: bool = False
    after: str | None = None


@dataclass(frozen=True)
class ThreadQuery:
    """A page of threads, in id order, after the thread `after` (None: from the first)."""

    limit: int
    environment_id: str | None = None
    after: str | None = None


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    more: bool
    """Whether anything follows the last item."""


@dataclass(frozen=True)
class ShowEnvironment:
    environment_id: str
    min_position: int = 0
    at: int | datetime | None = None
    """The document as it was at this version, or at this instant (the last version recorded then
    or before), folded from the event store; None: the read model's, now."""


@dataclass(frozen=True)
class HistoryQuery:
    """A page of an environment's events, in log order, after its version `after` (0: from the first)."""

    environment_id: str
    limit: int
    after: int = 0


@dataclass(frozen=True)
class HookOutputQuery:
    environment_id: str
    operation_id: str
    offset: int = 0


@dataclass(frozen=True)
class HookOutput:
    text: str
    next_offset: int
    more: bool


@dataclass(frozen=True)
class Spawn:
    """`thread spawn`: a thread, and where it runs: a new environment of a provider (on this spawn's
    host, whatever host the intent names), an existing one, or (None) its parent's."""

    environment: Intent | None
    thread_id: str | None = None
    project_path: str | None = None
    host_id: str | None = None
    parent_thread_id: str | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a command left: the environment it concerned (if any), its status, and the log's head."""

    environment_id: str | None
    status: str | None
    position: int


CANDIDATES_NAMED = 5
"""How many of the environments an ambiguous id prefix begins are named in the refusal."""


@dataclass(frozen=True)
class SpawnedThread:
    """What `thread spawn` made: the thread, its environment (if it has one yet) with its status,
    and the log's position after the spawn (as an `Outcome`'s)."""

    thread_id: str
    environment_id: str | None
    status: str
    position: int


@dataclass(frozen=True)
class DoctorRequest:
    fix: bool = False


class LogViews(Protocol):
    """The read model's views of the log, read on the rebuild's own worker thread."""

    def latest_views(self, after: int, upto: int | None = None) -> ViewPage: ...


class Api:
    def __init__(
        self,
        store: Store,
        read_model: ReadModel,
        placer: Placer,
        hosts: Hosts,
        threads: ThreadHandlers,
        provisioner: Provisioner,
        doctor: Doctor,
        host_id: str,
        stream_position: Callable[[], Awaitable[int]],
        publish_thread_message: Callable[[str, str, datetime], Awaitable[None]],
        log_views: Callable[[], LogViews],
        grace_for: GraceLookup,
    ) -> None:
        """`log_views` makes a fresh reader of the log for each replay; `grace_for` is the retire
        grace in force for a provider, as the application service applies it."""
        self._store = store
        self._app = store.app
        self._read_model = read_model
        self._placer = placer
        self._hosts = hosts
        self._threads = threads
        self._provisioner = provisioner
        self._doctor = doctor
        self._host_id = host_id
        self._stream_position = stream_position
        self._publish_thread_message = publish_thread_message
        self._log_views = log_views
        self._grace_for = grace_for
        self._history = EnvironmentHistory(self._app)  # read on the store's reader thread alone

    # -- queries -------------------------------------------------------------------------------

    async def providers(self) -> list[ProviderDescription]:
        """The providers of the host a spawn goes to by default (else this service's own), each
        with the policy in force: BB_RETIRE_GRACE_MS replaces the grace a provider declares, and
        an operator reads what will happen, not the default. While that host's agent is away, each
        is as this service's release declares it, its availability waiting for the agent."""
        try:
            host_id = await self._placer.default_host()
        except InvalidInput:  # no host to place on by default: the providers are the same everywhere
            host_id = self._host_id
        try:
            described_there = await self._hosts.host(host_id).providers(host_id)
        except HostUnavailable as away:
            waiting = Availability("blocked", str(away))  # which host, and since when
            described_there = [ProviderDescription.of(profile, waiting) for profile in self._hosts.profiles().values()]
        return [
            msgspec.structs.replace(
                described,
                policy=msgspec.structs.replace(described.policy, retire_grace_ms=self._grace_for(described.id)),
            )
            for described in described_there
        ]

    async def list_environments(self, query: EnvironmentQuery) -> Page[EnvironmentView]:
        if query.after is not None:
            check_environment_id(query.after)
        include_removed = query.include_removed or query.status == EnvironmentStatus.REMOVED
        # One more than asked says whether another page follows, without counting the rest.
        found = await self._read_model.environments(
            query.status, query.provider_id, include_removed, after=query.after, limit=query.limit + 1
        )
        return Page(found[: query.limit], len(found) > query.limit)

    async def show_environment(self, request: ShowEnvironment) -> EnvironmentView:
        identity = await self._environment_named(request.environment_id)
        if request.at is not None:
            # The store holds every version; the read model only the latest (a position to wait
            # for would change nothing: what the store has committed is there to read).
            return await self._environment_then(identity, request.at)
        environment_id = str(identity)
        if request.min_position:
            # A position the log has not reached would be waited for in vain, then blamed on the bus.
            head = await self._store.read_log(self._app.head)
            if not 0 < request.min_position <= head:
                raise InvalidInput(f"minPosition {request.min_position} is not a position of the log (1 to {head})")
            try:
                await self._read_model.wait_for(request.min_position)
            except TimeoutError:
                # Its consumer waits for the bus (or for disk space) to come back.
                raise Unavailable(
                    f"the read model has not reached log position {request.min_position} yet; ask again shortly"
                ) from None
        view = await self._read_model.environment(environment_id)
        if view is None:
            # Removed long enough ago to be forgotten by the read model: the log still has it.
            try:
                return await self._store.read_log(self._history.latest, identity)
            except UnknownEnvironment:
                raise NotFound(f"no environment {request.environment_id}") from None
        view.transcript = await self._read_model.transcript(environment_id)
        return view

    async def _environment_then(self, environment_id: UUID, at: int | datetime) -> EnvironmentView:
        try:
            if isinstance(at, datetime):
                if at.tzinfo is None:
                    raise InvalidInput(f"the instant {at.isoformat()} has no timezone; add one (Z for UTC)")
                return await self._store.read_log(self._history.at_instant, environment_id, at)
            if at < 1:
                raise InvalidInput(f"version {at} is not a version: an environment's versions start at 1")
            return await self._store.read_log(self._history.at_version, environment_id, at)
        except NotRecorded as missing:
            raise InvalidInput(str(missing)) from None

    async def environment_history(self, query: HistoryQuery) -> Page[LoggedEvent]:
        environment_id = await self._environment_named(query.environment_id)
        if query.after < 0:
            raise InvalidInput(f"after {query.after} is not a version: give 0 (from the first) or a version")
        events, more = await self._store.read_log(self._history.events, environment_id, query.after, query.limit)
        return Page(events, more)

    async def hook_output(self, request: HookOutputQuery) -> HookOutput:
        """A page of one of the environment's hook operations' output, from its host's records."""
        environment_id = await self._environment_named(request.environment_id)
        if request.offset < 0:
            raise InvalidInput(f"offset {request.offset} is not allowed: give 0 (from the start) or a nextOffset")
        recorded = await self._store.run(self._app.recorded_hook, request.operation_id)
        if recorded is None or recorded.environment_id != str(environment_id):
            raise NotFound(f"environment {environment_id} has no hook operation {quoted(request.operation_id)}")
        try:
            text, next_offset, more = await self._hosts.host(recorded.host_id).hook_output(
                recorded.host_id, recorded.operation_id, request.offset
            )
        except HostUnavailable as away:
            raise Unavailable(f"the output is on host {recorded.host_id!r}, which does not answer: {away}") from None
        return HookOutput(text, next_offset, more)

    async def list_threads(self, query: ThreadQuery) -> Page[ThreadView]:
        environment_id = str(await self._environment_named(query.environment_id)) if query.environment_id else None
        if query.after is not None:
            check_thread_id(query.after)
        found = await self._read_model.threads(environment_id, after=query.after, limit=query.limit + 1)
        return Page(found[: query.limit], len(found) > query.limit)

    # -- commands ------------------------------------------------------------------------------

    async def delete_environment(self, environment_id: str) -> Outcome:
        return await self._command_on(await self._environment_named(environment_id), self._app.request_deletion)

    async def retry_environment(self, environment_id: str) -> Outcome:
        identity = await self._environment_named(environment_id)
        environment = await self._store.run(self._app.environment, identity)
        path_key, claimed_path = await self._placer.next_attempt(
            environment.provider_id,
            environment.origin_thread_id,
            environment.attempt,
            environment.host_id,
            environment.project_path,
            environment.inputs,
            environment.path_key,
        )
        return await self._command_on(identity, lambda named: self._app.retry(named, path_key, claimed_path))

    async def _command_on(self, environment_id: UUID, command: Callable[[UUID], Environment]) -> Outcome:
        environment = await self._store.run(command, environment_id)
        await self._provisioner.drive(environment.id, environment)
        return await self._accepted(environment)

    async def spawn_thread(self, request: Spawn) -> SpawnedThread:
        thread_id = check_thread_id(request.thread_id or f"t-{uuid4().hex[:16]}")
        host_id = await self._placer.check_known(check_host_id(request.host_id or await self._placer.default_host()))
        if request.parent_thread_id is not None:
            check_thread_id(request.parent_thread_id)
        intent = await self._intent(request, host_id)
        lookup = self._store.run(self._app.find_thread, thread_id)
        if isinstance(intent, NewEnvironment):
            # Both are trips off the loop; overlapped they cost one. A spawn sent again pays for a
            # placement it discards, which changes nothing (the provider contract's queries only),
            # to be quick for a new thread.
            existing, placement = await asyncio.gather(
                lookup, self._placer.place(thread_id, intent, request.project_path, host_id), return_exceptions=True
            )
        else:
            existing, placement = await lookup, None
        if isinstance(existing, BaseException):
            raise existing
        if existing is not None:
            # Answered as the first spawn was, whatever placing it again said.
            environment = await self._spawned_before(existing, request, intent, host_id)
        else:
            if isinstance(placement, BaseException):
                raise placement
            try:
                environment = await self._threads.spawn(
                    RegisterThread(
                        thread_id=thread_id,
                        project_path=placement.project_path if placement else request.project_path,
                        parent_thread_id=request.parent_thread_id,
                        host_id=host_id,
                        environment=intent,
                    ),
                    placement,
                )
            except (RequestError, DomainError):
                # The same spawn sent again may be saved by another replica while this one places it
                # (a client resends an attempt answered slowly): the first save wins, the other is
                # refused for the thread or its path, and is answered as a spawn sent again.
                existing = await self._store.run(self._app.find_thread, thread_id)
                if existing is None:
                    raise
                environment = await self._spawned_before(existing, request, intent, host_id)
            else:
                # Start at once, not when the event comes round.
                await self._provisioner.drive(environment.id, environment)
        if request.prompt is not None:
            # The prompt is the thread's first message, for whoever runs the thread's agent; it is
            # published where any service's thread messages go, not kept in the environment log.
            try:
                await self._publish_thread_message(thread_id, request.prompt, datetime.now(UTC))
            except Exception as error:
                raise RequestError(
                    f"thread {thread_id} was created, but its prompt could not be published ({error}); "
                    f"the same spawn sent again publishes it"
                ) from None
        accepted = await self._accepted(environment)
        return SpawnedThread(
            thread_id, accepted.environment_id, accepted.status or EnvironmentStatus.CREATING, accepted.position
        )

    async def _spawned_before(self, thread: Thread, request: Spawn, intent: Intent | None, host_id: str) -> Environment:
        """The environment of a spawn sent again (its answer was lost with a connection, say): the
        same request is answered as the first was, never spawned twice; another one is refused."""
        asked = RegisterThread(
            thread_id=thread.thread_id,
            parent_thread_id=request.parent_thread_id,
            host_id=host_id,
            environment=intent,
            project_path=await self._placer.project(request.project_path, host_id)
            if isinstance(intent, NewEnvironment)
            else request.project_path,
        )
        if thread.environment_id is None or not await self._threads.registers_as(thread, asked):
            raise InvalidInput(f"thread {thread.thread_id} already exists; pick another --thread-id")
        return await self._store.run(self._app.environment, thread.environment_id)

    async def _intent(self, request: Spawn, host_id: str) -> Intent | None:
        intent = request.environment
        if isinstance(intent, NewEnvironment):
            _check_nesting(intent.inputs)
            return NewEnvironment(intent.provider_id, host_id, intent.inputs)
        if isinstance(intent, ExistingEnvironment):
            environment_id = await self._environment_named(intent.environment_id)
            await self._store.run(self._app.environment, environment_id)
            return ExistingEnvironment(str(environment_id))
        if request.parent_thread_id:
            await self._store.run(self._app.thread, request.parent_thread_id)
            return None
        raise InvalidInput("say where the thread runs: --environment-provider P, --environment ENV_ID or --parent T")

    async def thread_command(self, message: ArchiveThread | UnarchiveThread | CancelThreadMessage) -> Outcome:
        await self._store.run(self._app.thread, check_thread_id(message.thread_id))
        environment = await self._threads.handle(message)
        if environment is not None:
            await self._provisioner.drive(environment.id, environment)
        return await self._accepted(environment)

    async def doctor(self, request: DoctorRequest) -> Findings:
        try:
            return await (self._doctor.fix() if request.fix else self._doctor.examine())
        except HostUnavailable as silent:
            raise Unavailable(
                f"a host did not answer, so what it holds is unknown: {silent}; ask again shortly"
            ) from None

    async def replay(self) -> ReplayCounts:
        """Rebuild the read models from the whole log (`bb events replay`)."""
        return await self._read_model.rebuild(self._log_views().latest_views, self._stream_position)

    async def _environment_named(self, text: str) -> UUID:
        """The environment `text` names: its whole id, or (as git and docker take them) a start of
        it that begins one environment's id alone, whichever command it came with. An id that
        begins several is the caller's to lengthen, and is answered with some of them."""
        if not is_environment_id_prefix(text):
            return check_environment_id(text)
        found = await self._read_model.environment_ids_starting(text.lower(), limit=CANDIDATES_NAMED + 1)
        if not found:
            raise NotFound(f"no environment id begins with {quoted(text)}")
        if len(found) > 1:
            named = ", ".join(found[:CANDIDATES_NAMED]) + (" and more" if len(found) > CANDIDATES_NAMED else "")
            raise InvalidInput(
                f"environment id {quoted(text)} is ambiguous: {named} begin with it; give more of the id"
            )
        return UUID(found[0])

    async def _accepted(self, environment: Environment | None) -> Outcome:
        position = await self._store.read_log(self._app.head)
        if environment is None:
            return Outcome(None, None, position)
        return Outcome(str(environment.id), environment.public_status, position)


def _check_nesting(inputs: Any) -> None:
    # Level by level rather than recursively: deep input is what this refuses.
    level = [inputs]
    for _ in range(MAX_INPUTS_NESTING + 1):
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())
        ]
        if not level:
            return
    raise InvalidInput(f"environment inputs nest deeper than {MAX_INPUTS_NESTING} levels")
