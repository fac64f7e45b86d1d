"""The host agent's composition: one machine's hook runtime on the bus, answering to the ledger it is given.

Assembled apart from the core: this module and everything it imports load no event store, no read
model and nothing of the core's service layer (tests/unit/test_import_graph.py holds it to that), so
the same agent runs inside `bb serve` or as a process of its own that shares only the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging

from nats.aio.client import Client

from bb_environments.bus.agent.host_agent import HostAgent
from bb_environments.bus.health import BusHealth
from bb_environments.bus.transcript_publisher import TranscriptPublisher
from bb_environments.entrypoints.config import Settings, hook_record_sync, run_hooks_as
from bb_environments.hooks.ledger import HookLedger
from bb_environments.hooks.runner import HookRunner
from bb_environments.providers.host.containment import host_containment

log = logging.getLogger(__name__)


async def start_host_agent(settings: Settings, nc: Client, ledger: HookLedger, health: BusHealth,
                           started: contextlib.AsyncExitStack) -> HostAgent:
    """The agent of `settings.host_id`, serving on `nc` (its own user's connection); its stopping
    is pushed on `started`."""
    run_as = run_hooks_as(settings)
    if run_as is None:
        log.warning("BB_WORKSPACE_USER is unset: hooks run as %s and can read the credentials and the state "
                    "in %s (docs/security.md)", getpass.getuser(), settings.data_dir)
    runner = HookRunner(settings.data_dir / "hooks", settings.hook_timeout_s, hook_record_sync(),
                        containment=host_containment(settings.data_dir / "containment"), run_as=run_as)
    transcript = TranscriptPublisher(nc, asyncio.get_running_loop(), health=health)
    agent = HostAgent(nc, runner, settings.host_id, transcript, ledger, health=health)
    service = await agent.start()
    started.push_async_callback(agent.stop)
    started.push_async_callback(service.stop)
    return agent


async def keep_hook_records(agent: HostAgent, settings: Settings) -> None:
    """The agent's upkeep: the records of hooks whose environments were removed long enough ago go."""
    while True:
        await agent.forget_removed(settings.removed_retention_s)
        await asyncio.sleep(settings.sweep_interval_s)
