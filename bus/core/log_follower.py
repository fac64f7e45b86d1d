"""The core's followers of its own streams: the log feeds the read model, then the threads' placement
outcomes, then the provisioner; the transcripts stream feeds the read model's transcript tails.

One consumer of the whole log does both: a second one for the provisioner had every environment
event delivered, checked and acknowledged twice. Only what the store wrote is believed (TrustedLog).
"""

from __future__ import annotations

import contextlib
import logging
from uuid import UUID

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.bus.core.placements import Placements
from bb_environments.bus.core.trusted_log import TrustedLog
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.documents import EnvironmentEvent
from bb_environments.bus.wire.transcript_lines import TranscriptLine
from bb_environments.handlers.api import Api
from bb_environments.handlers.application import Environments
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store
from bb_environments.projections.read_model import Applied, ReadModel
from bb_environments.projections.tables import View
from bb_environments.projections.views import TranscriptEntry

log = logging.getLogger(__name__)


class OutcomesOut:
    """How far the follower has published the threads' placement outcomes, per environment (the
    provisioner's `Outcomes` port): up to the version its read model holds, unless a batch holding
    events of the environment is applied there and its outcomes are not all published yet (or
    failed to be: that batch comes again)."""

    def __init__(self, read_model: ReadModel) -> None:
        self._read_model = read_model
        self._pending: set[str] = set()

    async def out_for(self, environment_id: UUID, version: int) -> bool:
        if str(environment_id) in self._pending:
            return False
        view = await self._read_model.environment(str(environment_id))
        return view is not None and view.version >= version

    def pending(self, environment_ids: set[str]) -> None:
        self._pending |= environment_ids

    def published(self, environment_ids: set[str]) -> None:
        self._pending -= environment_ids


class LogFollower:
    """Handles the batches of the log consumer: read model first (a thread that hears its outcome
    finds it there), then the outcomes, then every environment they moved."""

    def __init__(
        self,
        store: Store,
        log_reader: LogReader,
        read_model: ReadModel,
        placements: Placements,
        provisioner: Provisioner,
    ) -> None:
        self._store = store
        self._log_reader = log_reader
        self._read_model = read_model
        self._placements = placements
        self._provisioner = provisioner
        self._outcomes = OutcomesOut(read_model)
        provisioner.wait_for_outcomes(self._outcomes)
        self._trusted = TrustedLog(lambda ids: store.read_log(log_reader.at, ids), subjects.LOG_CONSUMER)

    async def handle_batch(self, messages: list[Msg]) -> None:
        admitted = await self._trusted.admit(messages)
        moved = {event.environment_id for a in admitted if isinstance(event := a.logged.document, EnvironmentEvent)}
        self._outcomes.pending(moved)
        await self._read_model.apply(
            [Applied(a.logged.notification_id, a.message.metadata.sequence.stream, a.logged.view) for a in admitted],
            self._fill_gap,
        )
        await self._placements.announce(a.logged.document for a in admitted)
        self._outcomes.published(moved)
        latest: dict[str, int] = {}
        for a in admitted:
            if isinstance(event := a.logged.document, EnvironmentEvent):
                latest[event.environment_id] = max(event.version, latest.get(event.environment_id, 0))
        # One environment that cannot be driven now holds up none of the others; the batch is then
        # delivered again (the read model keeps what it applied) and the failed ones driven again.
        failures = []
        for environment_id, version in latest.items():
            try:
                await self._provisioner.catch_up(UUID(environment_id), version)
            except Exception as failure:
                failures.append(failure)
        if failures:
            raise failures[0]

    async def _fill_gap(self, after: int, upto: int) -> list[tuple[int, View]]:
        return await self._store.read_log(self._log_reader.between, after, upto)


class TranscriptFollower:
    """Handles the batches of the transcripts consumer: each line joins its environment's tail."""

    def __init__(self, read_model: ReadModel) -> None:
        self._read_model = read_model

    async def handle_batch(self, messages: list[Msg]) -> None:
        await self._read_model.add_transcript([_entry(m.metadata.sequence.stream, m.data) for m in messages])


def _entry(sequence: int, data: bytes) -> TranscriptEntry:
    line = msgspec.json.decode(data, type=TranscriptLine)
    return TranscriptEntry(sequence, line.environment_id, line.kind == "step", line.text)


async def restore_read_models(
    app: Environments, store: Store, read_model: ReadModel, damage: str | None, api: Api, js: JetStreamContext
) -> None:
    """Read models lost, emptied or set aside as damaged are rebuilt from the log before anything
    reads them, in one line of the log."""
    if read_model.position > 0 or not await store.read_log(app.head):
        if damage:
            log.warning("%s; the event log is empty, so the read models start empty", damage)
        return
    # The transcript tails are not in the log: their consumer starts over from the stream's start.
    # Deleted first: a crash after the rebuild would leave no sign that it is still to be done.
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(subjects.TRANSCRIPTS_STREAM, subjects.TRANSCRIPTS_CONSUMER)
    counts = await api.replay()
    log.warning(
        "%s; rebuilt them from the log: %d events, %d environments, %d threads",
        damage or "the read models were empty",
        counts.events,
        counts.environments,
        counts.threads,
    )
