"""`bb serve`: one core replica and its host's agent in one process, on an embedded or external NATS.

This module holds what a running service needs around the two: the locks on its data dir and
store, the embedded nats-server, one connection per user, the server file and the signals. What
the core is made of is entrypoints/bootstrap.py's; what the agent is made of, entrypoints/agent.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from bb_environments.bus.access import (
    SERVICE_INBOX_PREFIX,
    SERVICE_USER,
    Credentials,
    all_users,
    host_agent_inbox_prefix,
    host_agent_user,
    server_configuration,
)
from bb_environments.bus.agent.heartbeat import beat
from bb_environments.bus.agent.job_worker import HostJobWorker
from bb_environments.bus.core.api_endpoints import ApiEdge, translate_error
from bb_environments.bus.core.api_service import start_api
from bb_environments.bus.core.host_directory import BusHostDirectory
from bb_environments.bus.core.job_queue import HostJobQueue, HostLiveness
from bb_environments.bus.core.ledger_answers import answer_ledger_questions
from bb_environments.bus.core.log_follower import restore_read_models
from bb_environments.bus.core.remote_host import RemoteHost
from bb_environments.bus.core.replicas import (
    ActivityAcrossReplicas,
    DriveShare,
    Lease,
    Presence,
    ReplicaRefused,
    join,
    lease_holder,
    leases_bucket,
    live_replica_count,
    present_replicas,
)
from bb_environments.bus.core.secret_sharing import SecretsAcrossReplicas
from bb_environments.bus.core.thread_messages import StreamPorts
from bb_environments.bus.embedded_server import SERVER_NAME, NatsServerUnavailable, SupervisedNats
from bb_environments.bus.health import BusHealth
from bb_environments.bus.jetstream import ConnectOptions, JetStream, connect
from bb_environments.bus.streams import NoRoomForStreams, ensure_hosts, prepare_bus
from bb_environments.bus.transcript_publisher import TranscriptPublisher
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.server_file import SERVER_FILE, ClientSeeds, ServerFileError, ServerInfo, read_server_file
from bb_environments.entrypoints.agent import build_local_host, keep_hook_records, serve_host
from bb_environments.entrypoints.bootstrap import Ports, Replication, StoreUnusable, build_core, core_workers, relay_of
from bb_environments.entrypoints.config import (
    SERVE_LOCK,
    ConfigError,
    Holder,
    ServerFile,
    Settings,
    event_store_file,
    nats_credentials,
    run_hooks_as,
    url_without_credentials,
)
from bb_environments.handlers.ports import Everything, NoOtherReplica
from bb_environments.handlers.secrets import Secrets
from bb_environments.handlers.store import StoreLedger
from bb_environments.hooks.ledger import HookLedger
from bb_environments.hooks.local_host import LocalHost
from bb_environments.providers.host.durable_files import write_durably
from bb_environments.providers.host.file_lock import FileLock
from bb_environments.providers.registry import ProviderRegistry

log = logging.getLogger("bb.serve")

SERVER_FILE_CHECK_S = 2.0


class ServeError(RuntimeError):
    """`bb serve` cannot start or carry on; the message is the one line it ends with."""


class AlreadyServing(ServeError):
    pass


def hold_data_dir(data_dir: Path) -> FileLock:
    """One service per data dir; the lock dies with the process, even on SIGKILL."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)  # seeds, the event store and prompts live here: its owner's only
    lock = FileLock(data_dir / SERVE_LOCK)
    if not lock.acquire():
        holder = lock.holder(Holder)
        lock.close()
        who = f"another `bb serve` (pid {holder.pid})" if holder else "another `bb serve`"
        raise AlreadyServing(f"{who} is running on data dir {data_dir}{_reached_at(data_dir, holder)}")
    lock.record(Holder(os.getpid(), str(data_dir)))
    return lock


def _reached_at(data_dir: Path, holder: Holder | None) -> str:
    try:
        info = read_server_file(data_dir / SERVER_FILE)
    except ServerFileError:
        return " (it is starting, or rewrites its server.json within seconds)"
    return f", reachable at {info.nats_url}" if holder is None or info.pid == holder.pid else ""


def hold_event_store(settings: Settings) -> FileLock | None:
    """One service per SQLite store, whatever data dir names it: an SQLite store has one writer
    (handlers/writers.py SingleWriter). The lock lives beside it; a PostgreSQL store is shared by
    the replicas that name it (docs/architecture.md, "Several replicas of the core")."""
    store = event_store_file(settings.event_store)
    if store is None:
        return None
    store.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(store.with_name(store.name + ".lock"))
    if not lock.acquire():
        holder = lock.holder(Holder)
        lock.close()
        who = f"`bb serve` pid {holder.pid} (data dir {holder.data_dir})" if holder else "another `bb serve`"
        raise AlreadyServing(f"the event store {store} is in use by {who}; one service writes to a store")
    lock.record(Holder(os.getpid(), settings.data_root))
    return lock


def embedded_nats(settings: Settings, credentials: Credentials) -> SupervisedNats:
    """Our own nats-server, admitting only the users whose seeds are in `credentials`."""
    credentials.ensure(all_users(settings.host_id))
    _write_server_configuration(settings, credentials)
    return SupervisedNats.open(
        settings.data_dir / "nats",
        _server_configuration_file(settings),
        settings.data_dir / "nats-port",
        settings.nats_port,
    )


def _server_configuration_file(settings: Settings) -> Path:
    return settings.data_dir / "nats-server.conf"


def _write_server_configuration(settings: Settings, credentials: Credentials) -> None:
    configuration = server_configuration(credentials, settings.host_id, SERVER_NAME)
    write_durably(_server_configuration_file(settings), configuration.encode())


def _admitting_users(settings: Settings, credentials: Credentials, embedded: SupervisedNats) -> Callable[[], None]:
    """Have the running embedded server admit the users the seeds now name: a host registered,
    rotated or removed takes effect at once, with no restart of anything."""

    def admit() -> None:
        _write_server_configuration(settings, credentials)
        embedded.server.reload_configuration(settings.data_dir / "nats")

    return admit


def connect_options(settings: Settings, credentials: Credentials | None, user: str) -> ConnectOptions:
    """The embedded server knows each of our users by its seed; an external one gets the deployment's."""
    if credentials is None:
        return nats_credentials(settings.nats_url)
    return {"nkeys_seed": str(credentials.seed_file(user))}


async def serve(
    settings: Settings, ready: Callable[[dict[str, Any]], None] | None = None, *, agent_here: bool = True
) -> None:
    """Run until SIGTERM or SIGINT; `agent_here` False (`--no-agent`) leaves this host's work to a
    `bb agent` of its own. Whatever ends it, everything it started is stopped first (the
    nats-server included, and every thread that would keep the process alive); a failure ends it
    with ServeError. Only a SIGKILL leaves the nats-server running, for the next start to reuse."""
    loop = asyncio.get_running_loop()
    stop, past_start = asyncio.Event(), asyncio.Event()
    starting = asyncio.current_task()

    def on_signal() -> None:
        if not stop.is_set() and not past_start.is_set() and starting is not None:
            starting.cancel()  # the start has no stop check of its own: it ends where it is
        stop.set()

    # Before anything starts, so that a signal at any moment of the start stops what started.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        async with contextlib.AsyncExitStack() as started:
            try:
                await _serve(settings, ready, started, stop, past_start, agent_here)
            finally:
                past_start.set()  # a signal must not cut the stopping of what started short
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
    except ServeError:
        raise
    except (NatsServerUnavailable, StoreUnusable, ConfigError, NoRoomForStreams) as failed:
        raise ServeError(str(failed)) from None
    except Exception as failed:
        # One line for the operator; where it failed is for whoever debugs it.
        log.debug("bb serve failed", exc_info=True)
        raise ServeError(
            f"bb serve failed: {failed} ({type(failed).__name__}; BB_LOG_LEVEL=DEBUG shows where)"
        ) from None
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _serve(
    settings: Settings,
    ready: Callable[[dict[str, Any]], None] | None,
    started: contextlib.AsyncExitStack,
    stop: asyncio.Event,
    past_start: asyncio.Event,
    agent_here: bool,
) -> None:
    run_as = run_hooks_as(settings)
    if run_as is not None:
        # The workspace user passes through the data dir to its workspaces: nothing the service
        # makes there may be readable to it (providers/host/workspace_user.py).
        os.umask(0o077)
    started.callback(hold_data_dir(settings.data_dir).close)
    if run_as is not None:
        run_as.open_data_dir(settings.data_dir)
    if store_lock := hold_event_store(settings):
        started.callback(store_lock.close)
    credentials = None if settings.nats_url else Credentials(settings.data_dir / "credentials")
    embedded = None if credentials is None else embedded_nats(settings, credentials)
    if embedded:
        started.callback(embedded.stop)
    nats_url = embedded.url if embedded else settings.nats_url
    assert nats_url  # without a NATS url of its own, serve starts an embedded server
    loop = asyncio.get_running_loop()
    health = BusHealth(starting=True)  # one report of an outage for every connection and loop below
    nc = await connect(
        nats_url,
        f"bb-serve-{settings.host_id}",
        health,
        SERVICE_INBOX_PREFIX,
        **connect_options(settings, credentials, SERVICE_USER),
    )
    started.push_async_callback(_close, nc)
    js = JetStream(nc)
    await prepare_bus(
        js, health, settings.threads_max_age_s, settings.threads_max_bytes, settings.stream_replicas, settings.host_id
    )
    host_seeds = credentials or Credentials(settings.data_dir / "credentials")
    presence = await _present(settings, js, health, started)
    replication = await _replication(settings, nc, js, health)

    liveness = HostLiveness(js)
    registry = ProviderRegistry.from_entry_points(settings.extra_providers)
    stream = StreamPorts(js)
    hosts = BusHostDirectory(
        host_seeds,
        js,
        liveness,
        _admitting_users(settings, credentials, embedded) if credentials and embedded else None,
    )
    agent_nc = None
    if agent_here:
        # The agent of this host has a connection of its own user, as a `bb agent` would.
        agent_nc = await connect(
            nats_url,
            f"bb-host-agent-{settings.host_id}",
            health,
            host_agent_inbox_prefix(settings.host_id),
            **connect_options(settings, credentials, host_agent_user(settings.host_id)),
        )
        started.push_async_callback(_close, agent_nc)
    # The service's own lines, and those of the agent in this process, which is the service too: written
    # where they are read, in the order they were said, with no check (bus/core/transcript_intake.py
    # is for the agents of other processes, whose credentials may be another's).
    transcript = TranscriptPublisher(nc, loop, health=health)

    def host_here(ledger: HookLedger) -> LocalHost:
        # Today's layout (workspaces under the data dir) unless BB_AGENT_ROOT gives this host's a
        # root of their own; what is on disk already keeps its recorded paths either way.
        return build_local_host(
            settings,
            registry,
            settings.workspaces_root,
            settings.data_dir,
            transcript,
            ledger,
            earlier_data_dir=settings.data_dir if settings.agent_root else None,
        )

    core = await build_core(
        settings,
        registry,
        Ports(
            RemoteHost(nc, HostJobQueue(nc, js, liveness, health=health)),
            hosts,
            transcript,
            stream.stream_position,
            stream.publish_thread_message,
            here=host_here if agent_here else None,
            share=replication.share if replication else Everything(),
            activity_elsewhere=replication.activity if replication else NoOtherReplica(),
        ),
        started,
    )
    if replication is not None:
        started.push_async_callback(_unsubscribe, await replication.activity.hear(core.provisioner.heard_activity))
        sharing = SecretsAcrossReplicas(nc, settings.replica_id, lambda: present_replicas(js))
        core.secrets.peers = sharing
        started.push_async_callback(_unsubscribe, await sharing.answer(core.secrets))
        fetching = asyncio.create_task(_fetch_lacking_secrets(core.secrets))
        started.push_async_callback(_cancel, [fetching])
    # Every host the log knows has its queue, whichever replica registered it.
    known_hosts = await core.machines.known()
    await health.once_answered("the hosts' job queues", lambda: ensure_hosts(js, known_hosts, settings.stream_replicas))
    for answering in await answer_ledger_questions(nc, StoreLedger(core.store, core.secrets.for_hook), health):
        started.push_async_callback(_unsubscribe, answering)
    agent_work: list[Coroutine[Any, Any, None]] = []
    if core.here is not None and agent_nc is not None:
        # The core calls its host directly; the bus reaches the same host as it would a `bb agent`'s.
        await serve_host(agent_nc, settings, core.here, started)
        agent_work = [
            keep_hook_records(core.here, settings),
            beat(agent_nc, settings.host_id, settings.data_root, metadata.version("bb-environments"), health),
        ]
        if replication is not None:
            # Another replica may drive an environment of this host: it queues its jobs for this agent.
            agent_work.append(HostJobWorker(agent_nc, settings.host_id, core.here, health=health).run())
    relay = await relay_of(core, js, nc, health, replicated=replication is not None)
    await restore_read_models(core.app, core.store, core.read_model, core.read_model_damage, core.api, js)
    tasks = [
        asyncio.create_task(w)
        for w in (*core_workers(core, relay, js, health, settings, replication), presence.run(health), *agent_work)
    ]
    started.push_async_callback(_cancel, tasks)

    service = await start_api(
        nc,
        ApiEdge(
            core.api, core.machines, core.secrets, core.pools, nc.max_payload, lambda: present_replicas(js)
        ).endpoints(),
        translate_error,
    )
    started.push_async_callback(service.stop)
    await nc.flush()  # the API's subscriptions are live on the server before anyone reads server.json

    server_file = ServerFile(
        Path(settings.server_file),
        ServerInfo(
            nats_url=url_without_credentials(nats_url),
            pid=os.getpid(),
            host_id=settings.host_id,
            data_dir=settings.data_root,
            nats_pid=embedded.server.pid if embedded else None,
            nats_port=embedded.server.port if embedded else None,
            credentials=ClientSeeds(**credentials.client_files()) if credentials else None,
        ),
    )
    server_file.write()
    started.callback(server_file.remove)
    kept = [server_file.keep(SERVER_FILE_CHECK_S)]
    if embedded:
        kept.append(embedded.watch(lambda server: server_file.update(nats_pid=server.pid)))
    tasks.extend(asyncio.create_task(k) for k in kept)
    past_start.set()
    health.started()
    if ready:
        ready(msgspec.to_builtins(server_file.info))
    await _until_stopped_or_failed(stop, tasks)


async def _present(
    settings: Settings, js: JetStreamContext, health: BusHealth, started: contextlib.AsyncExitStack
) -> Presence:
    """Enter this replica's presence, kept while it runs whatever its store: refused beside a
    replica of the same id, or beside any other when either's store is SQLite."""
    store = "sqlite" if event_store_file(settings.event_store) else "postgresql"
    try:
        presence = await join(js, settings.replica_id, settings.data_root, store, settings.stream_replicas, health)
    except ReplicaRefused as refused:
        raise ServeError(str(refused)) from None
    started.push_async_callback(presence.leave)
    return presence


async def _replication(settings: Settings, nc: Client, js: JetStreamContext, health: BusHealth) -> Replication | None:
    """What a replica on a store several replicas may share shares with them (None: an SQLite store)."""
    if event_store_file(settings.event_store):
        return None
    leases, holder = await leases_bucket(js, settings.stream_replicas, health), lease_holder(settings.replica_id)
    return Replication(
        DriveShare(leases, holder, lambda: live_replica_count(js)),
        Lease(leases, subjects.RELAY_LEASE, holder),
        Lease(leases, subjects.TRANSCRIPT_INTAKE_LEASE, holder),
        ActivityAcrossReplicas(nc),
    )


async def _fetch_lacking_secrets(secrets: Secrets) -> None:
    try:
        await secrets.fetch_lacking()
    except Exception:  # not worth stopping the replica: a hook's question asks the others again
        log.exception("fetching the secret values this replica lacks from the other replicas failed")


async def _close(nc: Any) -> None:
    with contextlib.suppress(Exception):
        await nc.close()


async def _unsubscribe(subscription: Any) -> None:
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=5)


async def _until_stopped_or_failed(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    for task in done:
        if task is not stopping and (failure := task.exception()) is not None:
            raise failure
