"""The core's periodic sweep: what recovery, deadlines and retries need, driven on from the log,
and what retention drops."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from nats.js import JetStreamContext

from bb_environments.bus.core.transcript_retention import forget_removed_transcripts
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.projections.read_model import ReadModel
from bb_environments.providers.saved_work import prune_saved_refs

log = logging.getLogger(__name__)


async def sweep_forever(caught_up: asyncio.Event, threads: ThreadHandlers, provisioner: Provisioner,
                        js: JetStreamContext, read_model: ReadModel, removed_retention_s: float,
                        interval_s: float, saved_work_notes: Path, saved_ref_retention_s: float) -> None:
    """Once the relay has caught the bus up with the store: threads still waiting for an
    environment, every unfinished environment, transcripts past retention and work saved from
    removed worktrees past its own, every `interval_s`."""
    await caught_up.wait()
    while True:
        await threads.resume_waiting()
        await provisioner.sweep()
        await forget_removed_transcripts(js, read_model, removed_retention_s)
        await prune_saved_work(saved_work_notes, saved_ref_retention_s)
        await asyncio.sleep(interval_s)


async def prune_saved_work(notes_dir: Path, max_age_s: float) -> None:
    """Delete the saved refs this host made longer than `max_age_s` ago. Git work on the host, run
    here as the provider's remove is, in this process: the host of `bb serve` is the core's own."""
    try:
        pruned = await asyncio.to_thread(prune_saved_refs, notes_dir, max_age_s)
    except Exception:
        # Not worth stopping the sweep that calls this: the next one tries again.
        log.exception("deleting saved work past retention failed")
        return
    if pruned:
        log.info("deleted %d saved refs older than BB_SAVED_REF_RETENTION_S", len(pruned))
