"""The core's edge for thread events: decode what a publisher sent, check it, hand it to the handlers.

A refused event is logged by subject and reason, never its content (a prompt, a secret), told to
its thread as a placement outcome with the same reason, and acknowledged: sending it again would
not make it valid. No handler sees a wire struct: each event becomes the command the handlers take
(handlers/commands.py).
"""

from __future__ import annotations

import logging

import msgspec
from nats.aio.msg import Msg

from bb_environments.bus.core.placements import Placements
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.refusals import refusal_reason
from bb_environments.bus.wire.thread_events import (
    EnvironmentIntent,
    ExistingIntent,
    InboundThreadMessage,
    MessageCancelledMessage,
    ThreadArchivedMessage,
    ThreadCreatedMessage,
    ThreadMessageMessage,
    ThreadUnarchivedMessage,
    inbound_decoder,
)
from bb_environments.domain.errors import DomainError
from bb_environments.domain.request_errors import RequestError, UnknownThreadMessage
from bb_environments.handlers import commands
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.providers.host.crash_points import crash_point

log = logging.getLogger(__name__)


class ThreadEventConsumer:
    """Handles the batches of one thread partition's in-order consumer, one event at a time."""

    def __init__(self, threads: ThreadHandlers, placements: Placements, provisioner: Provisioner) -> None:
        self._threads = threads
        self._placements = placements
        self._provisioner = provisioner

    async def handle_batch(self, messages: list[Msg]) -> None:
        for message in messages:
            await self.handle(message)
            crash_point("thread-event-handled")  # before its ack: it is delivered again

    async def handle(self, message: Msg) -> None:
        subject = subjects.published_subject(message.subject)
        subject_thread = subject.split(".")[2]
        try:
            event = inbound_decoder.decode(message.data)
        except (msgspec.DecodeError, RecursionError) as malformed:  # RecursionError: nested too deep
            reason = refusal_reason(malformed)
            log.warning("refused a thread event on %s: %s", subject, reason)
            await self._refused(message, subject_thread, reason)
            return
        if subject_thread != event.thread_id:
            log.warning("refused a thread event on %s: it names thread %s", subject, event.thread_id)
            await self._refused(message, subject_thread, "its threadId is not the thread its subject names")
            return
        try:
            environment = await self._threads.handle(thread_command(event))
        except UnknownThreadMessage as unknown:
            log.warning("ignored a message for unknown thread %s", event.thread_id)
            await self._refused(message, subject_thread, str(unknown))
            return
        except (RequestError, DomainError) as refused:
            log.warning("refused a thread event on %s: %s", subject, refused)
            await self._refused(message, subject_thread, str(refused))
            return
        if environment is not None:
            if isinstance(event, ThreadMessageMessage):
                environment = await self._provisioner.note_activity(environment)
            await self._provisioner.drive(environment.id, environment)

    async def _refused(self, message: Msg, subject_thread: str, reason: str) -> None:
        await self._placements.refused_at_edge(subject_thread, reason, message)


def intent_command(intent: EnvironmentIntent) -> commands.Intent:
    """A thread event's intent, as the handlers take it."""
    if isinstance(intent, ExistingIntent):
        return commands.ExistingEnvironment(intent.environment_id)
    host = None if intent.machine is None else intent.machine.host_id
    return commands.NewEnvironment(intent.environment_provider_id, host, intent.inputs)


def thread_command(message: InboundThreadMessage) -> commands.ThreadCommand:
    """A decoded thread event, as the command the handlers take (the bus's edge: no handler
    sees a wire struct)."""
    match message:
        case ThreadCreatedMessage():
            return commands.RegisterThread(
                thread_id=message.thread_id,
                project_path=message.project_path,
                parent_thread_id=message.parent_thread_id,
                host_id=message.host_id,
                environment=None if message.environment is None else intent_command(message.environment),
            )
        case ThreadMessageMessage():
            return commands.ProvideEnvironment(message.thread_id)
        case ThreadArchivedMessage():
            return commands.ArchiveThread(message.thread_id)
        case ThreadUnarchivedMessage():
            return commands.UnarchiveThread(message.thread_id)
        case MessageCancelledMessage():
            return commands.CancelThreadMessage(message.thread_id)
    raise TypeError(f"not a thread event: {type(message).__name__}")
