"""`bb serve`: the composition root that wires the service together and runs it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bb_environments.bus.wire import subjects
from bb_environments.bus.access import (
    SERVICE_INBOX_PREFIX,
    SERVICE_USER,
    Credentials,
    all_users,
    host_agent_inbox_prefix,
    host_agent_user,
    server_configuration,
    write_private_file,
)
from bb_environments.bus.core.api_endpoints import ApiEdge, translate_error
from bb_environments.bus.core.api_service import start_api
from bb_environments.bus.core.thread_consumer import ThreadEventConsumer
from bb_environments.bus.wire.documents import EnvironmentEvent
from bb_environments.bus.wire.thread_events import ThreadMessageMessage
from bb_environments.bus.wire.transcript_lines import TranscriptLine
from bb_environments.bus.embedded_server import SERVER_NAME, NatsServerUnavailable, SupervisedNats
from bb_environments.bus.health import BusHealth
from bb_environments.bus.agent.host_agent import HostAgent
from bb_environments.bus.core.agent_client import HostAgentClient, LocalFirstHooks
from bb_environments.bus.jetstream import (
    ConnectOptions, connect, consume, ensure_streams, ensure_thread_partition_consumers, retire_provisioner_consumer)
from bb_environments.bus.core.log_reader import LogReader
from bb_environments.bus.core.relay import AckedPublisher, OutboxRelay
from bb_environments.bus.core.trusted_log import TrustedLog
from bb_environments.bus.core.transcript_retention import forget_removed_transcripts
from bb_environments.bus.transcript_publisher import TranscriptPublisher
from bb_environments.entrypoints.bootstrap import Core, Ports, StoreUnusable, bootstrap
from bb_environments.entrypoints.config import (
    SERVE_LOCK,
    SERVER_FILE,
    ClientSeeds,
    Holder,
    ServerFile,
    ServerFileError,
    ServerInfo,
    Settings,
    event_store_file,
    hook_record_sync,
    nats_credentials,
    read_server_file,
    url_without_credentials,
)
from bb_environments.handlers.store import StoreLedger
from bb_environments.hooks.runner import HookRunner
from bb_environments.projections.read_model import Applied, View
from bb_environments.projections.views import TranscriptEntry
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
    """One writer per event store, whatever data dir names it: the store's consistency (one writer
    thread, aggregates cached from it, path claims) assumes it. The lock lives beside an SQLite store;
    a PostgreSQL store is not guarded (README)."""
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
    store_dir, configuration = settings.data_dir / "nats", settings.data_dir / "nats-server.conf"
    credentials.ensure(all_users(settings.host_id))
    write_private_file(configuration, server_configuration(credentials, settings.host_id, SERVER_NAME))
    return SupervisedNats.open(store_dir, configuration)


def connect_options(settings: Settings, credentials: Credentials | None, user: str) -> ConnectOptions:
    """The embedded server knows each of our users by its seed; an external one gets the deployment's."""
    if credentials is None:
        return nats_credentials(settings.nats_url)
    return {"nkeys_seed": str(credentials.seed_file(user))}


async def serve(settings: Settings, ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT. Whatever ends it, everything it started is stopped first (the
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
                await _serve(settings, ready, started, stop, past_start)
            finally:
                past_start.set()  # a signal must not cut the stopping of what started short
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
    except ServeError:
        raise
    except (NatsServerUnavailable, StoreUnusable) as failed:
        raise ServeError(str(failed)) from None
    except Exception as failed:
        # One line for the operator; where it failed is for whoever debugs it.
        log.debug("bb serve failed", exc_info=True)
        raise ServeError(f"bb serve failed: {failed} ({type(failed).__name__}; "
                         "BB_LOG_LEVEL=DEBUG shows where)") from None
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _serve(settings: Settings, ready: Callable[[dict[str, Any]], None] | None, started: contextlib.AsyncExitStack,
                 stop: asyncio.Event, past_start: asyncio.Event) -> None:
    started.callback(hold_data_dir(settings.data_dir).close)
    if store_lock := hold_event_store(settings):
        started.callback(store_lock.close)
    credentials = None if settings.nats_url else Credentials(settings.data_dir / "credentials")
    embedded = None if credentials is None else embedded_nats(settings, credentials)
    if embedded:
        started.callback(embedded.stop)
    nats_url = embedded.url if embedded else settings.nats_url
    assert nats_url  # without a NATS url of its own, serve starts an embedded server
    loop = asyncio.get_running_loop()
    health = BusHealth()  # one report of an outage for every connection and loop below
    nc = await connect(nats_url, f"bb-serve-{settings.host_id}", health, SERVICE_INBOX_PREFIX,
                       **connect_options(settings, credentials, SERVICE_USER))
    started.push_async_callback(_close, nc)
    agent_nc = await connect(nats_url, f"bb-host-agent-{settings.host_id}", health,
                             host_agent_inbox_prefix(settings.host_id),
                             **connect_options(settings, credentials, host_agent_user(settings.host_id)))
    started.push_async_callback(_close, agent_nc)
    js = nc.jetstream()
    await ensure_streams(js, settings.threads_max_age_s, settings.threads_max_bytes)
    await ensure_thread_partition_consumers(js)
    await retire_provisioner_consumer(js)

    async def stream_position() -> int:
        info = await js.stream_info(subjects.ENVIRONMENTS_STREAM)
        return info.state.last_seq

    async def publish_thread_message(thread_id: str, text: str, occurred_at: datetime) -> None:
        message = ThreadMessageMessage(thread_id=thread_id, text=text, occurred_at=occurred_at)
        # One first message per thread, even when a spawn is sent again: within the duplicate
        # window the stream drops the copy, and after it the stream still holds the first.
        subject = subjects.thread_event(message.thread_id, "message")
        try:
            await js.get_last_msg(subjects.THREADS_STREAM, subject)
            return
        except NotFoundError:
            pass
        await js.publish(subject, msgspec.json.encode(message), headers={"Nats-Msg-Id": f"{message.thread_id}:prompt"})

    hooks = LocalFirstHooks(settings.host_id, HostAgentClient(nc, health=health))
    core = await bootstrap(
        settings, ProviderRegistry.from_entry_points(settings.extra_providers),
        Ports(hooks, TranscriptPublisher(nc, loop, health=health), stream_position,
              publish_thread_message),
        started,
    )
    app, store, read_model, threads, provisioner = core.app, core.store, core.read_model, core.threads, core.provisioner
    host_agent = HostAgent(agent_nc, HookRunner(settings.data_dir / "hooks", settings.hook_timeout_s, hook_record_sync()),
                           settings.host_id, TranscriptPublisher(agent_nc, loop, health=health), StoreLedger(store),
                           health=health)
    hooks.attach(host_agent)
    agent_service = await host_agent.start()
    started.push_async_callback(host_agent.stop)
    started.push_async_callback(agent_service.stop)
    log_reader = LogReader(app)
    relay = OutboxRelay(js, AckedPublisher(nc), lambda after: store.read_log(log_reader.page, after),
                        lambda ids: store.read_log(log_reader.at, ids), health=health)
    app.on_saved = lambda: loop.call_soon_threadsafe(relay.wake)

    # One consumer of the whole log feeds the read model and then the provisioner: a second one for
    # the provisioner had every environment event delivered, checked and acknowledged twice.
    log_check = TrustedLog(lambda ids: store.read_log(log_reader.at, ids), subjects.LOG_CONSUMER)

    async def fill_gap(after: int, upto: int) -> list[tuple[int, View]]:
        return await store.read_log(log_reader.between, after, upto)

    async def follow_log(messages: list[Msg]) -> None:
        admitted = await log_check.admit(messages)
        await read_model.apply(
            [Applied(a.logged.notification_id, a.message.metadata.sequence.stream, a.logged.view) for a in admitted],
            fill_gap,
        )
        latest: dict[str, int] = {}
        for a in admitted:
            if isinstance(event := a.logged.document, EnvironmentEvent):
                latest[event.environment_id] = max(event.version, latest.get(event.environment_id, 0))
        # One environment that cannot be driven now holds up none of the others; the batch is then
        # delivered again (the read model keeps what it applied) and the failed ones driven again.
        failures = []
        for environment_id, version in latest.items():
            try:
                await provisioner.catch_up(UUID(environment_id), version)
            except Exception as failure:
                failures.append(failure)
        if failures:
            raise failures[0]

    async def store_transcript(messages: list[Msg]) -> None:
        await read_model.add_transcript([_transcript_entry(m.metadata.sequence.stream, m.data) for m in messages])

    async def sweep_forever() -> None:
        await relay.caught_up.wait()
        while True:
            await threads.resume_waiting()
            await provisioner.sweep()
            await host_agent.forget_removed(settings.removed_retention_s)
            await forget_removed_transcripts(js, read_model, settings.removed_retention_s)
            await asyncio.sleep(settings.sweep_interval_s)

    thread_events = ThreadEventConsumer(threads, provisioner)
    await _restore_read_models(core, js)
    workers: list[Coroutine[Any, Any, None]] = [
        relay.run(),
        consume(js, subjects.ENVIRONMENTS_STREAM, subjects.LOG_CONSUMER, subjects.LOG_EVENTS, follow_log, health),
        consume(js, subjects.TRANSCRIPTS_STREAM, subjects.TRANSCRIPTS_CONSUMER, subjects.TRANSCRIPT_EVENTS, store_transcript, health),
        # A thread's events are handled in the order they were sent, one at a time, by its
        # partition's consumer; the partitions run side by side.
        *(consume(js, subjects.THREAD_PARTITIONS_STREAM, subjects.thread_partition_consumer(partition),
                  subjects.thread_partition(partition), thread_events.handle_batch, health, in_order=True)
          for partition in range(subjects.THREAD_PARTITIONS)),
        sweep_forever(),
    ]
    tasks = [asyncio.create_task(w) for w in workers]
    started.push_async_callback(_cancel, tasks)

    service = await start_api(nc, ApiEdge(core.api, nc.max_payload).endpoints(), translate_error)
    started.push_async_callback(service.stop)
    await nc.flush()  # the API's subscriptions are live on the server before anyone reads server.json

    server_file = ServerFile(Path(settings.server_file), ServerInfo(
        nats_url=url_without_credentials(nats_url), pid=os.getpid(), host_id=settings.host_id,
        data_dir=settings.data_root,
        nats_pid=embedded.server.pid if embedded else None, nats_port=embedded.server.port if embedded else None,
        credentials=ClientSeeds(**credentials.client_files()) if credentials else None,
    ))
    server_file.write()
    started.callback(server_file.remove)
    kept = [server_file.keep(SERVER_FILE_CHECK_S)]
    if embedded:
        kept.append(embedded.watch(lambda server: server_file.update(nats_pid=server.pid)))
    tasks.extend(asyncio.create_task(k) for k in kept)
    past_start.set()
    if ready:
        ready(msgspec.to_builtins(server_file.info))
    await _until_stopped_or_failed(stop, tasks)


async def _close(nc: Any) -> None:
    with contextlib.suppress(Exception):
        await nc.close()


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=5)


async def _restore_read_models(core: Core, js: JetStreamContext) -> None:
    """Read models lost, emptied or set aside as damaged are rebuilt from the log before anything
    reads them, in one line of the log."""
    damage = core.read_model_damage
    if core.read_model.position > 0 or not await core.store.read_log(core.app.head):
        if damage:
            log.warning("%s; the event log is empty, so the read models start empty", damage)
        return
    # The transcript tails are not in the log: their consumer starts over from the stream's start.
    # Deleted first: a crash after the rebuild would leave no sign that it is still to be done.
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(subjects.TRANSCRIPTS_STREAM, subjects.TRANSCRIPTS_CONSUMER)
    counts = await core.api.replay()
    log.warning("%s; rebuilt them from the log: %d events, %d environments, %d threads",
                damage or "the read models were empty", counts.events, counts.environments, counts.threads)


async def _until_stopped_or_failed(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    for task in done:
        if task is not stopping and (failure := task.exception()) is not None:
            raise failure


def _transcript_entry(sequence: int, data: bytes) -> TranscriptEntry:
    line = msgspec.json.decode(data, type=TranscriptLine)
    return TranscriptEntry(sequence, line.environment_id, line.kind == "step", line.text)
