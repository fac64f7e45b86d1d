"""The core's periodic sweep: what recovery, deadlines and retries need, driven on from the log."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext

from bb_environments.bus.core.transcript_retention import forget_removed_transcripts
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.projections.read_model import ReadModel


async def sweep_forever(caught_up: asyncio.Event, threads: ThreadHandlers, provisioner: Provisioner,
                        js: JetStreamContext, read_model: ReadModel, removed_retention_s: float,
                        interval_s: float) -> None:
    """Once the relay has caught the bus up with the store: threads still waiting for an
    environment, every unfinished environment, and transcripts past retention, every `interval_s`."""
    await caught_up.wait()
    while True:
        await threads.resume_waiting()
        await provisioner.sweep()
        await forget_removed_transcripts(js, read_model, removed_retention_s)
        await asyncio.sleep(interval_s)
