"""The core's upkeep of transcripts: those of long-removed environments are dropped."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from nats.js import JetStreamContext

from bb_environments.bus.wire import subjects
from bb_environments.projections.read_model import ReadModel

log = logging.getLogger(__name__)


async def forget_removed_transcripts(js: JetStreamContext, read_model: ReadModel, max_age_s: float) -> None:
    """Drop the transcripts of environments removed longer than `max_age_s` ago: first from the
    stream, then from the read model, so a service killed in between finds them again next time."""
    try:
        removed = await read_model.transcripts_removed_before(datetime.now(timezone.utc) - timedelta(seconds=max_age_s))
        for environment_id in removed:
            await js.purge_stream(subjects.TRANSCRIPTS_STREAM, subject=subjects.transcript(environment_id))
        await read_model.forget_transcripts(removed)
    except Exception:
        # Not worth stopping the sweep that calls this: the next one tries again.
        log.exception("dropping the transcripts of removed environments failed")
        return
    if removed:
        log.info("dropped the transcripts of %d removed environments", len(removed))
