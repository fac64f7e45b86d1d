"""Placement outcomes: each thread hears where it stands on `bb.placements.<threadId>.<status>`.

They are derived from the log as the log follower receives it, so an outcome is never announced
for something the store did not write. A batch of the log may be delivered again (a crash before
its ack) and an outcome may be reached by two events (a thread joins while its environment gets
ready): each is published under a message id naming the thread, the environment, the outcome and
the environment's version when the thread joined it, so that a thread that leaves and joins again
is placed, and hears, again, and the stream drops a repeat within its duplicate window. A repeat may
come later than that (a service, or a replica, back after minutes away reads on where it stopped):
an outcome due longer ago than half the window is published only if its subject's last message is
neither that outcome nor a later one. Refusals that never reach the log (an event refused at the
edge) are published by the thread consumer, under the id of the stream message refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from uuid import UUID

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from bb_environments.bus.health import jetstream_code
from bb_environments.bus.streams import DUPLICATE_WINDOW_S
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.documents import (
    CreateFailedDocument,
    Document,
    EnvironmentEvent,
    ReadyDocument,
    SetupFailedDocument,
    ThreadAttachedDocument,
)
from bb_environments.bus.wire.log_only_documents import ThreadRefusedDocument
from bb_environments.bus.wire.placements import PlacementOutcome, PlacementStatus
from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import UnknownEnvironment
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.handlers.store import Store
from bb_environments.providers.host.crash_points import crash_point

_SETTLING = (ReadyDocument, SetupFailedDocument, CreateFailedDocument)
_READY_THEN = (ReadyDocument, ThreadAttachedDocument)
"""Events after which the environment was ready for its threads if it was ready at all: announced
from the environment as it was then when it has moved on (a failure, though, only as it stands now)."""
_BEYOND_THE_WINDOW = timedelta(seconds=DUPLICATE_WINDOW_S / 2)
"""Half the window: the service's clock may differ from the clock that dated the outcome."""
_CLOCKS_DIFFER = timedelta(seconds=5)
_WILDCARDS = ("*", ">")
DUPLICATE_IN_PROCESS = 10158
"""A clustered stream's refusal of a message whose id another publish is being stored under."""
_IN_PROCESS_PAUSE_S = 0.05


class Placements:
    def __init__(self, js: JetStreamContext, store: Store) -> None:
        self._js = js
        self._store = store

    async def announce(self, documents: Iterable[Document]) -> None:
        """The outcomes these documents of the log reached, in log order.

        An environment's outcome for its threads is its state now (the store may be ahead of the
        batch): a thread that joins an environment ready already is ready at once, and a failure
        the environment retries by itself is announced only if its retries run out. An environment
        that was ready at the event and is no longer, or has lost threads since (archived at once),
        is announced as it was then: it was ready for them. Its removal waits until this has run
        for its events (handlers/provisioning.py), so no thread hears `ready` after `removed`."""
        for document in documents:
            if isinstance(document, ThreadRefusedDocument):
                await self._publish(
                    PlacementOutcome(
                        occurred_at=document.occurred_at,
                        thread_id=document.thread_id,
                        environment_id=None,
                        status="refused",
                        reason=document.message,
                    ),
                    f"{document.thread_id}:-:refused:{document.version}",
                    due_since=document.occurred_at,
                )
            elif isinstance(document, ThreadAttachedDocument):
                await self._settled(document, [document.thread_id])
            elif isinstance(document, _SETTLING):
                await self._settled(document, document.thread_ids)

    async def refused_at_edge(self, subject_thread_id: str, reason: str, refused: Msg) -> None:
        """A thread event refused before anything was stored, told on its subject's thread token
        whatever it holds (a thread id the service does not allow, `a/b`, is still where its
        publisher waits); only a wildcard token has no subject of its own to be told on."""
        if subject_thread_id in _WILDCARDS:
            return
        await self._publish(
            PlacementOutcome(
                occurred_at=datetime.now(UTC),
                thread_id=subject_thread_id,
                environment_id=None,
                status="refused",
                reason=reason,
            ),
            f"{subject_thread_id}:-:refused:event-{refused.metadata.sequence.stream}",
            due_since=refused.metadata.timestamp,
        )

    async def _settled(self, event: EnvironmentEvent, thread_ids: list[str]) -> None:
        try:
            environment = await self._store.run(self._store.app.environment, UUID(event.environment_id))
        except UnknownEnvironment:
            return
        if (
            isinstance(event, _READY_THEN)
            and environment.version > event.version
            and (_outcome(environment)[0] is None or any(t not in environment.joined_at for t in thread_ids))
        ):
            # No longer ready, or some of its threads gone (archived at once, say; its removal
            # waits for this outcome): it was ready for the threads on it then.
            environment = await self._store.run(self._store.app.repository.get, environment.id, version=event.version)
        status, reason = _outcome(environment)
        if status is None:
            return
        for thread_id in thread_ids:
            joined = environment.joined_at.get(thread_id)
            if joined is not None:  # it has not left since
                await self._publish(
                    PlacementOutcome(
                        occurred_at=event.occurred_at,
                        thread_id=thread_id,
                        environment_id=event.environment_id,
                        status=status,
                        reason=reason,
                    ),
                    f"{thread_id}:{event.environment_id}:{status}:{joined}",
                    due_since=event.occurred_at,
                )

    async def _publish(self, outcome: PlacementOutcome, message_id: str, due_since: datetime) -> None:
        subject = subjects.placement(outcome.thread_id, outcome.status)
        if datetime.now(UTC) - due_since > _BEYOND_THE_WINDOW and await self._published_since(
            subject, message_id, due_since
        ):
            return
        payload, headers = msgspec.json.encode(outcome), {"Nats-Msg-Id": message_id}
        try:
            await self._js.publish(subject, payload, headers=headers)
        except APIError as refused:
            if jetstream_code(refused) != DUPLICATE_IN_PROCESS:
                raise
            # Every replica announces what it follows in the log: the other's publish of this very
            # outcome is being stored. Sent again a moment later, it is the duplicate it is (or
            # stored, had that one failed), where failing would retry the log's whole batch.
            await asyncio.sleep(_IN_PROCESS_PAUSE_S)
            await self._js.publish(subject, payload, headers=headers)
        crash_point("placement-published")  # before the log's batch is acknowledged: it is delivered again

    async def _published_since(self, subject: str, message_id: str, due_since: datetime) -> bool:
        """Whether the subject's last outcome is this one, or one stored after this one was due (a
        later placement of the thread: this one is old news). The server's clock stored it, so a
        few seconds of difference from the clock that dated the outcome are allowed for."""
        try:
            last = await self._js.get_last_msg(subjects.PLACEMENTS_STREAM, subject)
        except NotFoundError:
            return False
        if (last.headers or {}).get("Nats-Msg-Id") == message_id:
            return True
        return last.time is not None and last.time >= due_since - _CLOCKS_DIFFER


def _outcome(environment: Environment) -> tuple[PlacementStatus | None, str | None]:
    if environment.status == EnvironmentStatus.READY:
        return "ready", None
    if environment.failed_for_good:
        return "error", environment.status_message
    return None, None
