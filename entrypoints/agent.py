"""The host agent's composition: one machine's hooks and workspaces (`LocalHost`) on the bus.

Assembled apart from the core: this module and everything it imports load no event store, no read
model and nothing of the core's service layer (tests/unit/test_import_graph.py holds it to that), so
the same host (`build_local_host`) runs inside `bb serve`, where its core also calls it directly,
or as a process of its own, `bb agent` (`run_agent`), that shares only the bus with the core: its
root, its hook records and its providers' directories are its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import signal
from importlib import metadata
from pathlib import Path

from nats.aio.client import Client

from bb_environments.bus.access import host_agent_inbox_prefix
from bb_environments.bus.agent.bus_ledger import BusLedger
from bb_environments.bus.agent.heartbeat import beat
from bb_environments.bus.agent.host_service import start_host_service
from bb_environments.bus.agent.job_worker import HostJobWorker
from bb_environments.bus.health import BusHealth
from bb_environments.bus.jetstream import connect
from bb_environments.bus.streams import TRANSCRIPT_LINES_PER_ENVIRONMENT
from bb_environments.bus.transcript_publisher import TranscriptPublisher
from bb_environments.entrypoints.config import (
    Settings,
    hook_limits,
    hook_output_max_bytes,
    hook_record_sync,
    nats_credentials,
    run_hooks_as,
)
from bb_environments.hooks.guarded import GuardedHooks
from bb_environments.hooks.ledger import HookLedger
from bb_environments.hooks.local_host import LocalHost
from bb_environments.hooks.runner import HookRunner
from bb_environments.providers.contract import Transcript
from bb_environments.providers.host.containment import host_containment
from bb_environments.providers.registry import ProviderRegistry

log = logging.getLogger("bb.agent")

CREDENTIALS_CHECK_S = 1.0


def build_local_host(
    settings: Settings,
    registry: ProviderRegistry,
    workspaces_root: Path,
    state: Path,
    transcript: Transcript,
    ledger: HookLedger,
    *,
    earlier_data_dir: Path | None = None,
) -> LocalHost:
    """The host `settings.host_id` in this process, for `bb agent` and `bb serve` alike: its
    providers' workspaces under `workspaces_root` (and `earlier_data_dir`, where they were before
    a root of their own), what it keeps of its hooks (their records, their containment) under
    `state`, its hooks run as the log that `ledger` reads allows."""
    run_as = run_hooks_as(settings)
    if run_as is None:
        log.warning(
            "BB_WORKSPACE_USER is unset: hooks run as %s and can read the credentials and the state "
            "in %s (docs/security.md)",
            getpass.getuser(),
            state,
        )
    containment = host_containment(state / "containment", hook_limits(settings))
    runner = HookRunner(
        state / "hooks",
        settings.hook_timeout_s,
        hook_record_sync(),
        hook_output_max_bytes(),
        containment=containment,
        run_as=run_as,
        git_hooks=settings.run_git_hooks,
        transcript_lines_kept=TRANSCRIPT_LINES_PER_ENVIRONMENT,
    )
    return LocalHost(
        registry,
        workspaces_root,
        transcript,
        hooks=GuardedHooks(runner, settings.host_id, transcript, ledger),
        earlier_data_dir=earlier_data_dir,
        containment=containment,
        workspace_user=run_as,
    )


async def serve_host(nc: Client, settings: Settings, host: LocalHost, started: contextlib.AsyncExitStack) -> None:
    """`host` answering its agent's queries on `nc` (its own user's connection); its stopping is pushed on `started`."""
    started.push_async_callback(host.hooks.stop)
    service = await start_host_service(nc, settings.host_id, host)
    started.push_async_callback(service.stop)


async def keep_hook_records(host: LocalHost, settings: Settings) -> None:
    """The agent's upkeep: the records of hooks whose environments were removed long enough ago go."""
    while True:
        await host.hooks.forget_removed(settings.removed_retention_s)
        await asyncio.sleep(settings.sweep_interval_s)


class CredentialsRefused(RuntimeError):
    """The server no longer admits this agent's seed: its host was removed, or its seed rotated."""


async def check_identity(nc: Client, host_id: str, health: BusHealth) -> None:
    """Raise CredentialsRefused unless the server lets `nc` act for `host_id`: a seed the server
    admits may be another host's, and then nothing the agent does would get through. Asked once, at
    the start, by subscribing to the agent's own inbox, which only its host's user may read: the
    server refuses the subscription before it answers a ping sent after it. nats-py writes a
    flush's ping at once but a subscription when its writer task next runs, so the first flush's
    ping may overtake it; the second is sent after that task has written it."""
    before = nc.last_error
    probe = await nc.subscribe(f"{host_agent_inbox_prefix(host_id)}.identity")
    try:
        for _ in range(2):
            await health.once_answered("the server's answer to who this agent is", nc.flush)
    finally:
        await probe.unsubscribe()
    if (refused := nc.last_error) is not before and "permissions violation for subscription" in str(refused).lower():
        raise CredentialsRefused(
            f"the server does not let these credentials act for host {host_id!r}: they are another host's "
            f"seed, or the server's permissions for host-{host_id} are not those docs/security.md gives"
        )


def credentials_refused(nc: Client, host_id: str) -> CredentialsRefused | None:
    """Why the agent must end now, if it must: the server refuses its credentials at a reconnect
    (its host was removed, or its seed rotated), which would otherwise be refused, and logged, twice
    a second for ever. A permissions violation after the start ends nothing: the identity was
    checked then (check_identity), and what the server refuses later is a reply whose permission
    lapsed, to a request taken before a pause or a reconnect and answered on another node of the
    cluster; its asker sends it again."""
    if not nc.is_connected and "authorization violation" in str(nc.last_error).lower():
        return CredentialsRefused(
            f"the server refuses the credentials of host {host_id!r}'s agent: the host was removed, or its "
            "seed replaced (`bb machine register HOST --rotate` writes a new one); start the agent again with it"
        )
    return None


async def _until_refused(nc: Client, host_id: str) -> None:
    """Return never while the server admits the agent's credentials; raise once it refuses them."""
    while True:
        await asyncio.sleep(CREDENTIALS_CHECK_S)
        if (refused := credentials_refused(nc, host_id)) is not None:
            raise refused


def agent_root(settings: Settings, given: str | None) -> Path:
    """`--root`, else BB_AGENT_ROOT, else `<data dir>/hosts/<host id>` (SPEC 7.1)."""
    if given:
        return Path(os.path.realpath(os.path.expanduser(given)))
    return Path(settings.agent_root) if settings.agent_root else settings.data_dir / "hosts" / settings.host_id


async def run_agent(settings: Settings, credentials: Path, nats_url: str, root: Path) -> None:
    """`bb agent`: this host's agent, until SIGTERM or SIGINT, which stop it at any moment, its
    start (reaching the server) included. Workspaces go under `root`; what the agent keeps for
    itself (its hook records, their containment) under `root/.bb-agent`, readable by its user only."""
    loop = asyncio.get_running_loop()
    stop, past_start = asyncio.Event(), asyncio.Event()
    starting = asyncio.current_task()

    def on_signal() -> None:
        stop.set()
        if not past_start.is_set() and starting is not None:
            starting.cancel()  # the start has no stop check of its own: it ends where it is

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        await _serve_until_stopped(settings, credentials, nats_url, root, stop, past_start)
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _serve_until_stopped(
    settings: Settings, credentials: Path, nats_url: str, root: Path, stop: asyncio.Event, past_start: asyncio.Event
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    state = root / ".bb-agent"
    state.mkdir(mode=0o700, exist_ok=True)
    os.chmod(state, 0o700)
    health = BusHealth()
    options = {key: value for key, value in nats_credentials(nats_url).items() if key == "tls"}
    log.info("the agent of host %r is reaching %s", settings.host_id, nats_url)
    nc = await connect(
        nats_url,
        f"bb-agent-{settings.host_id}",
        health,
        host_agent_inbox_prefix(settings.host_id),
        nkeys_seed=str(credentials),
        **options,  # type: ignore[arg-type]
    )
    try:
        await check_identity(nc, settings.host_id, health)
        async with contextlib.AsyncExitStack() as started:
            transcript = TranscriptPublisher(nc, asyncio.get_running_loop(), health=health, host_id=settings.host_id)
            registry = ProviderRegistry.from_entry_points(settings.extra_providers)
            host = build_local_host(settings, registry, root, state, transcript, BusLedger(nc, settings.host_id))
            await serve_host(nc, settings, host, started)
            jobs = HostJobWorker(nc, settings.host_id, host, health=health)
            tasks = [
                asyncio.create_task(work)
                for work in (
                    jobs.run(),
                    beat(nc, settings.host_id, str(root), metadata.version("bb-environments"), health),
                    keep_hook_records(host, settings),
                    _until_refused(nc, settings.host_id),
                )
            ]
            past_start.set()
            log.info("the agent of host %r is serving from %s", settings.host_id, root)
            stopping = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in (*tasks, stopping):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                if task is not stopping and not task.cancelled() and (failure := task.exception()) is not None:
                    raise failure
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
