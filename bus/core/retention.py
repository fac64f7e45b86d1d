"""The core's retention of removed environments: once removed for longer than the limit
(BB_REMOVED_RETENTION_S), an environment leaves nothing in the streams or the read model.

The event store keeps its events; `show`, `history` and `events export` read them there. What goes:
- from BB_ENVIRONMENTS, every message on its log subjects up to its `removed`: its own, those of
  the claims released with it (the messages just after it), and those of the threads last on it
  (their later messages, of a later environment, stay). The stream's last message always stays:
  the relay reads its position from it, and would publish again whatever came after the last
  message left. An environment whose end is that message keeps its row until a pass after the
  next event;
- from BB_TRANSCRIPTS, its transcript, and from the read model its transcript lines, at once;
- from BB_PLACEMENTS, the outcomes of the threads last on it (it was their last environment, so
  every outcome they had is about it or an earlier one);
- from the read model, its row and the rows of the archived threads last on it.

In that order, the environment's own subject last of the stream's: a service killed midway finds
the environment again in the read model at the next pass and goes on, and one whose `removed`
message is gone from the stream has nothing left there to purge.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bb_environments.bus.wire import subjects
from bb_environments.domain.path_claim import claim_id
from bb_environments.projections.read_model import ReadModel
from bb_environments.projections.views import EnvironmentView

log = logging.getLogger(__name__)

FORGOTTEN_PER_PASS = 1000
"""Environments forgotten per pass of the sweep: a pass after a long outage, or after a rebuild of
the read model brought every pruned row back, takes its share and leaves the rest to the next."""


async def forget_removed_environments(js: JetStreamContext, read_model: ReadModel, max_age_s: float) -> None:
    """Forget what the streams and the read model keep of environments removed longer than
    `max_age_s` ago (see the module)."""
    try:
        removed = await read_model.removed_before(datetime.now(UTC) - timedelta(seconds=max_age_s), FORGOTTEN_PER_PASS)
        if not removed:
            return
        last_sequence = (await js.stream_info(subjects.ENVIRONMENTS_STREAM)).state.last_seq
        purged = []
        for environment in removed:
            threads = [thread.id for thread in await read_model.threads(environment.id)]
            await js.purge_stream(subjects.TRANSCRIPTS_STREAM, subject=subjects.transcript(environment.id))
            for thread in threads:
                await js.purge_stream(subjects.PLACEMENTS_STREAM, subject=subjects.placement(thread, ">"))
            if await _purge_log(js, environment, threads, last_sequence):
                purged.append(environment.id)
        await read_model.forget_transcripts([environment.id for environment in removed])
        await read_model.forget_environments(purged)
    except Exception:
        # Not worth stopping the sweep that calls this: the next one tries again.
        log.exception("forgetting removed environments failed")
        return
    if purged:
        log.info("forgot %d environments removed more than BB_REMOVED_RETENTION_S ago", len(purged))


async def _purge_log(
    js: JetStreamContext, environment: EnvironmentView, threads: list[str], last_sequence: int
) -> bool:
    """Purge the environment's log messages, and those of the `threads` last on it, below
    `last_sequence`, the stream's last; whether none of them is left."""
    try:
        removed_at = (
            await js.get_last_msg(
                subjects.ENVIRONMENTS_STREAM, subjects.log_event("environment", environment.id, "removed")
            )
        ).seq
    except NotFoundError:
        return True  # purged already: its own subject goes last
    assert removed_at is not None
    claims = {claim_id(environment.host_id, path) for path in (environment.claimed_path, environment.path) if path}
    # Released in the save that recorded `removed`, so stored right after it, in that order.
    claims_end = removed_at + len(claims)
    purges = [
        *((subjects.log_event("thread", thread, ">"), removed_at) for thread in threads),
        *((subjects.log_event("claim", str(claim), ">"), claims_end) for claim in claims),
    ]
    for subject, upto in purges:
        await js.purge_stream(subjects.ENVIRONMENTS_STREAM, subject=subject, seq=min(upto + 1, last_sequence))
    if claims_end >= last_sequence:
        return False  # its end is the stream's last message: its `removed` marks it for the next pass
    await js.purge_stream(subjects.ENVIRONMENTS_STREAM, subject=subjects.log_event("environment", environment.id, ">"))
    return True
