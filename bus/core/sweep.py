"""The core's periodic sweep: what recovery, deadlines and retries need, driven on from the log,
what retention drops, and now and then a line on what `bb doctor` would find."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from nats.js import JetStreamContext

from bb_environments.bus.core.retention import forget_removed_environments
from bb_environments.handlers.doctor import Doctor
from bb_environments.handlers.ports import HostUnavailable
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.projections.read_model import ReadModel
from bb_environments.providers.saved_work import prune_saved_refs

log = logging.getLogger(__name__)


async def sweep_forever(
    caught_up: asyncio.Event,
    threads: ThreadHandlers,
    provisioner: Provisioner,
    js: JetStreamContext,
    read_model: ReadModel,
    removed_retention_s: float,
    interval_s: float,
    saved_work_notes: Path,
    saved_ref_retention_s: float,
    doctor: Doctor,
    doctor_interval_s: float,
) -> None:
    """Once the relay has caught the bus up with the store: threads still waiting for an
    environment, every unfinished environment, what the streams and the read model keep of
    environments removed longer than retention ago, and work saved from removed worktrees past its
    own retention, every `interval_s`; what doctor would find, every
    `doctor_interval_s` (it asks every host, and git in every project)."""
    await caught_up.wait()
    examined_at: float | None = None
    while True:
        await threads.resume_waiting()
        await provisioner.sweep()
        await forget_removed_environments(js, read_model, removed_retention_s)
        await prune_saved_work(saved_work_notes, saved_ref_retention_s)
        if examined_at is None or time.monotonic() - examined_at >= doctor_interval_s:
            examined_at = time.monotonic()
            await report_findings(doctor)
        await asyncio.sleep(interval_s)


async def report_findings(doctor: Doctor) -> None:
    """One log line when doctor would find something; never a fix: that is for an operator to ask."""
    try:
        found = await doctor.examine()
    except HostUnavailable as away:
        # A host's agent away (or a replica's own host, served by no agent): its findings wait for it.
        log.info("looking for what `bb doctor` would find waits: %s", away)
        return
    except Exception:
        log.exception("looking for what `bb doctor` would find failed")
        return
    if found.orphans or found.missing:
        examples = [f"{orphan.kind} {orphan.path}" for orphan in found.orphans[:3]] + [
            f"missing {missing.path}" for missing in found.missing[:3]
        ]
        log.warning(
            "bb doctor would find %d orphans and %d missing workspaces (%s%s); `bb doctor --fix` "
            "removes and records them",
            len(found.orphans),
            len(found.missing),
            ", ".join(examples),
            ", ..." if len(found.orphans) > 3 or len(found.missing) > 3 else "",
        )


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
