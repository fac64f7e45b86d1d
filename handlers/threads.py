"""Thread events become commands: one handler per message, each safe to receive twice.

The same handlers serve the JetStream consumer of `bb.threads.>` and the CLI's `thread spawn`
request, so a raw NATS publisher and the CLI take the same checks and placement. Only where a
refusal goes differs: on the thread for a publisher, back to the caller (with no thread kept)
for a spawn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ParamSpec
from uuid import UUID

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import DomainError, PathAlreadyClaimed, UnknownThread
from bb_environments.domain.request_errors import InvalidInput, NotFound, Refused, RequestError, UnknownThreadMessage
from bb_environments.domain.thread import Thread
from bb_environments.handlers.commands import (
    ArchiveThread,
    CancelThreadMessage,
    ExistingEnvironment,
    Intent,
    NewEnvironment,
    ProvideEnvironment,
    RegisterThread,
    ThreadCommand,
    UnarchiveThread,
    intent_document,
    intent_from_document,
)
from bb_environments.handlers.placement import Placement, Placer, check_environment_id, check_host_id, check_thread_id
from bb_environments.handlers.ports import Hosts
from bb_environments.handlers.store import Store

log = logging.getLogger(__name__)

P = ParamSpec("P")


def _now() -> datetime:
    return datetime.now(UTC)


class ThreadHandlers:
    def __init__(self, store: Store, placer: Placer, hosts: Hosts) -> None:
        self._store = store
        self._app = store.app
        self._placer = placer
        self._hosts = hosts

    async def handle(self, message: ThreadCommand) -> Environment | None:
        """Dispatch from the consumer; a refusal is recorded on the thread rather than raised (a
        message for no thread has nothing to record it on: UnknownThreadMessage)."""
        check_thread_id(message.thread_id)
        match message:
            case RegisterThread():
                await self.created(message)
            case ProvideEnvironment():
                return await self.first_message(message.thread_id)
            case ArchiveThread():
                return await self._store.run(self._app.archive_thread, message.thread_id, _now())
            case UnarchiveThread():
                return await self._store.run(self._app.unarchive_thread, message.thread_id)
            case CancelThreadMessage():
                return await self._store.run(self._app.cancel_thread_message, message.thread_id)
        return None

    async def created(self, message: RegisterThread) -> Thread:
        return await self._store.run(self._app.register_thread, *await self._registration(message))

    async def spawn(self, message: RegisterThread, placement: Placement | None) -> Environment:
        """A thread with its first message (`bb thread spawn`), saved with the environment it gets
        or not at all: a refused spawn leaves no thread behind. `placement` is the new environment's,
        when the request named a provider (and was placed already)."""
        registration = await self._registration(message)
        target = await self._target(Thread(*registration), placement)
        return await self._given(self._app.spawn_thread, *registration, target)

    async def registers_as(self, thread: Thread, message: RegisterThread) -> bool:
        """Whether `message` would register `thread` exactly as the log has it."""
        registered = (thread.thread_id, thread.project_path, thread.parent_thread_id, thread.host_id, thread.intent)
        return await self._registration(message) == registered

    async def _registration(
        self, message: RegisterThread
    ) -> tuple[str, str | None, str | None, str, dict[str, Any] | None]:
        """The thread as the log registers it (id, project, parent, host, intent), each checked."""
        host_id = check_host_id(_host_of(message) or await self._placer.default_host())
        if message.parent_thread_id is not None:
            check_thread_id(message.parent_thread_id)
        intent = None if message.environment is None else await self._checked_intent(message.environment)
        return message.thread_id, message.project_path, message.parent_thread_id, host_id, intent

    async def _checked_intent(self, intent: Intent) -> dict[str, Any]:
        """The intent as the thread keeps it in the log: inputs as their provider's type reads them,
        so nothing a publisher adds beside them is stored; what fails that is refused here."""
        if isinstance(intent, ExistingEnvironment):
            return intent_document(ExistingEnvironment(str(check_environment_id(intent.environment_id))))
        inputs = await self._placer.inputs(intent.provider_id, intent.inputs)
        return intent_document(NewEnvironment(intent.provider_id, intent.machine_host_id, inputs))

    async def first_message(self, thread_id: str) -> Environment | None:
        """Give the thread its environment, unless it has one already.

        A refusal is recorded on the thread, so a raw NATS publisher can see why.
        """
        thread = await self._store.run(self._app.find_thread, thread_id)
        if thread is None:
            # There is no thread to record this on: the edge tells the publisher.
            raise UnknownThreadMessage(f"no thread {thread_id}: its created event comes first")
        if not thread.needs_environment:
            return None if thread.environment_id is None else await self._environment(thread.environment_id)
        # The request is saved with its answer: until then the message is not acknowledged, so a
        # crash in between has it delivered again.
        try:
            return await self._given(self._app.answer_first_message, thread_id, await self._target(thread, None))
        except (RequestError, DomainError) as refusal:
            log.info("thread %s refused: %s", thread_id, refusal)
            await self._store.run(self._app.refuse_thread, thread_id, str(refusal))
            return None

    async def place_waiting(self, thread_id: str) -> Environment | None:
        """Place a thread whose request is still open (its pool member could not be bound)."""
        thread = await self._store.run(self._app.find_thread, thread_id)
        if thread is None or not thread.awaits_environment:
            return None
        return await self.first_message(thread_id)

    async def resume_waiting(self) -> list[Environment]:
        """Threads whose first message was recorded but not yet answered (a crash came between)."""
        waiting = await self._store.run(self._app.threads_awaiting_environment)
        environments = [await self.first_message(thread_id) for thread_id in waiting]
        return [environment for environment in environments if environment is not None]

    async def _target(self, thread: Thread, placement: Placement | None) -> UUID | Placement:
        """The environment the thread joins, or where its new one will live."""
        intent, project_path = await self._intent_of(thread)
        if isinstance(intent, ExistingEnvironment):
            return check_environment_id(intent.environment_id)
        return placement or await self._placer.place(thread.thread_id, intent, project_path, thread.host_id)

    async def _given(self, command: Callable[P, Environment], *args: P.args, **kwargs: P.kwargs) -> Environment:
        """Run the store command that gives a thread its environment; a path conflict says what to do."""
        try:
            return await self._store.run(command, *args, **kwargs)
        except PathAlreadyClaimed as conflict:
            raise Refused(
                f"cannot claim the workspace path: {conflict}; "
                "to share that workspace, spawn with --environment and its id"
            ) from None

    async def _intent_of(self, thread: Thread) -> tuple[Intent, str | None]:
        """The thread's own intent, or what it inherits from its parent (with the parent's project).

        A child without a project of its own joins its parent's environment when the parent's
        provider shares with children; otherwise it gets a fresh one from the parent's intent.
        """
        if thread.intent is not None:
            return intent_from_document(thread.intent), thread.project_path
        if thread.parent_thread_id is None:
            raise InvalidInput(f"thread {thread.thread_id} has no environment intent and no parent")
        try:
            parent = await self._store.run(self._app.thread, thread.parent_thread_id)
        except UnknownThread:
            raise NotFound(f"no parent thread {thread.parent_thread_id}") from None
        if thread.project_path is None and parent.environment_id is not None:
            environment = await self._environment(parent.environment_id)
            profile = self._hosts.profiles().get(environment.provider_id)
            if profile is not None and profile.policy.children == "share" and environment.is_live:
                return ExistingEnvironment(str(environment.id)), None
        if parent.intent is not None:
            return intent_from_document(parent.intent), thread.project_path or parent.project_path
        raise InvalidInput(f"parent thread {thread.parent_thread_id} has no environment intent to inherit")

    async def _environment(self, environment_id: UUID) -> Environment:
        return await self._store.run(self._app.environment, environment_id)


def _host_of(message: RegisterThread) -> str | None:
    """The host the thread event names: its `hostId`, or the machine its intent names. Naming two
    different hosts is refused rather than one of them silently ignored."""
    intent = message.environment
    machine_host = intent.machine_host_id if isinstance(intent, NewEnvironment) else None
    if message.host_id is not None and machine_host is not None and machine_host != message.host_id:
        raise InvalidInput(
            f"the thread names host {message.host_id!r} but its environment intent names machine "
            f"{machine_host!r}: name one host, or the same in both"
        )
    return message.host_id or machine_host
