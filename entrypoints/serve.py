"""`bb serve`: the composition root that wires the service together and runs it."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import IO
from uuid import UUID

import msgspec
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from bus import subjects
from bus.api_service import start_api
from bus.documents import ThreadMessageMessage, TranscriptLine, inbound_decoder, refusal_reason
from bus.embedded_server import EmbeddedNats
from bus.health import BusHealth
from bus.host_agent import HostAgent, HostAgentClient
from bus.jetstream import connect, consume, ensure_streams
from bus.log_reader import LogReader
from bus.relay import OutboxRelay
from bus.trusted_log import TrustedLog
from bus.transcripts import TranscriptPublisher
from domain.application import Environments
from domain.errors import DomainError
from entrypoints.config import (
    Settings,
    event_store_environment,
    nats_credentials,
    read_server_file,
    url_without_credentials,
    write_server_file,
)
from handlers.api import Api, translate_error
from handlers.errors import RequestError
from handlers.placement import Placer
from handlers.provisioning import Provisioner
from handlers.store import Store, StoreLedger
from handlers.threads import ThreadHandlers
from projections.read_model import Applied, ReadModel
from providers.host.hooks import HookRunner
from providers.registry import ProviderRegistry

log = logging.getLogger("bb.serve")


class AlreadyServing(RuntimeError):
    pass


def hold_data_dir(data_dir: Path) -> IO[str]:
    """One service per data dir; the lock dies with the process, even on SIGKILL."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir / "serve.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise AlreadyServing(f"another `bb serve` is running on {data_dir}") from None
    return lock


def embedded_nats(settings: Settings) -> EmbeddedNats:
    previous = read_server_file(settings.server_file) or {}
    if previous.get("natsPid") and previous.get("natsPort"):
        reused = EmbeddedNats.reuse(previous["natsPid"], "127.0.0.1", previous["natsPort"])
        if reused is not None:
            log.info("reusing the embedded nats-server (pid %s)", reused.pid)
            return reused
    return EmbeddedNats.start(settings.data_dir / "nats")


async def serve(settings: Settings, ready: Callable[[dict], None] | None = None) -> None:
    lock = hold_data_dir(settings.data_dir)
    embedded = None if settings.nats_url else embedded_nats(settings)
    nats_url = settings.nats_url or embedded.url
    loop = asyncio.get_running_loop()
    health = BusHealth()  # one report of an outage for every connection and loop below
    nc = await connect(nats_url, f"bb-serve-{settings.host_id}", health, **nats_credentials())
    js = nc.jetstream()
    await ensure_streams(js, settings.threads_max_age_s, settings.threads_max_bytes)

    registry = ProviderRegistry.from_entry_points(settings.extra_providers)

    def grace_for(provider_id: str) -> int | None:
        """The provider's grace; BB_RETIRE_GRACE_MS replaces it, except for providers that never retire."""
        provider = registry.get(provider_id)
        grace = provider.policy.retire_grace_ms if provider else 300_000
        if grace is None or settings.retire_grace_override is None:
            return grace
        return settings.retire_grace_override[0]

    # One writer per store, so a cache of aggregates (fast-forwarded from the store) is safe.
    app = Environments(env={**event_store_environment(settings.event_store), "AGGREGATE_CACHE_MAXSIZE": "10000"},
                       grace_for=grace_for)
    store = Store(app)
    read_model = await ReadModel.open(settings.data_dir / "read-models.sqlite")
    placer = Placer(registry, settings.data_dir, settings.host_id)
    transcript = TranscriptPublisher(nc, loop, health=health)
    host_agent = HostAgent(nc, HookRunner(settings.data_dir / "hooks", settings.hook_timeout_s), settings.host_id,
                           transcript, StoreLedger(store), health=health)
    agent_service = await host_agent.start()
    provisioner = Provisioner(store, placer, HostAgentClient(nc, health=health), transcript,
                              timedelta(seconds=settings.transient_retry_s))
    threads = ThreadHandlers(store, placer, settings.host_id)
    log_reader = LogReader(app)
    relay = OutboxRelay(js, lambda after: store.read_log(log_reader.page, after),
                        lambda ids: store.read_log(log_reader.at, ids), health=health)
    app.on_saved = lambda: loop.call_soon_threadsafe(relay.wake)

    consumer_reader = LogReader(app)

    def trusted_log(consumer: str) -> TrustedLog:
        return TrustedLog(lambda ids: store.read_log(consumer_reader.at, ids), consumer)

    provisioning_log, projections_log = trusted_log("provisioner"), trusted_log("projections")

    async def drive_environments(messages: list[Msg]) -> None:
        latest: dict[str, int] = {}
        for admitted in await provisioning_log.admit(messages):
            event = admitted.logged.document
            latest[event.environment_id] = max(event.version, latest.get(event.environment_id, 0))
        for environment_id, version in latest.items():
            await provisioner.catch_up(UUID(environment_id), version)

    async def fill_gap(after: int, upto: int) -> list:
        return await store.read_log(consumer_reader.between, after, upto)

    async def apply_to_read_model(messages: list[Msg]) -> None:
        await read_model.apply(
            [Applied(admitted.logged.notification_id, admitted.message.metadata.sequence.stream,
                     admitted.logged.document)
             for admitted in await projections_log.admit(messages)],
            fill_gap,
        )

    async def store_transcript(messages: list[Msg]) -> None:
        await read_model.add_transcript(
            [(m.metadata.sequence.stream, _decode_transcript(m.data)) for m in messages]
        )

    async def handle_thread_events(messages: list[Msg]) -> None:
        for message in messages:
            await _handle_thread_event(threads, provisioner, message)

    async def sweep_forever() -> None:
        await relay.caught_up.wait()
        while True:
            await threads.resume_waiting()
            await provisioner.sweep()
            await asyncio.sleep(settings.sweep_interval_s)

    async def stream_position() -> int:
        info = await js.stream_info(subjects.ENVIRONMENTS_STREAM)
        return info.state.last_seq

    workers: list[Awaitable[None]] = [
        relay.run(),
        consume(js, subjects.ENVIRONMENTS_STREAM, "projections", subjects.LOG_EVENTS, apply_to_read_model, health),
        consume(js, subjects.TRANSCRIPTS_STREAM, "transcripts", subjects.TRANSCRIPT_EVENTS, store_transcript, health),
        consume(js, subjects.ENVIRONMENTS_STREAM, "provisioner", subjects.LOG_ENVIRONMENT_EVENTS, drive_environments,
                health),
        # One thread event at a time: a thread's events must be handled in the order they were sent.
        consume(js, subjects.THREADS_STREAM, "threads", subjects.THREAD_EVENTS, handle_thread_events, health,
                in_order=True),
        sweep_forever(),
    ]
    tasks = [asyncio.create_task(w) for w in workers]

    async def publish_thread_message(message: ThreadMessageMessage) -> None:
        # One first message per thread, even when a spawn is sent again: within the duplicate
        # window the stream drops the copy, and after it the stream still holds the first.
        subject = subjects.thread_event(message.thread_id, "message")
        try:
            await js.get_last_msg(subjects.THREADS_STREAM, subject)
            return
        except NotFoundError:
            pass
        await js.publish(subject, msgspec.json.encode(message), headers={"Nats-Msg-Id": f"{message.thread_id}:prompt"})

    api = Api(store, read_model, placer, threads, provisioner, settings.host_id, stream_position,
              publish_thread_message)
    service = await start_api(nc, api.endpoints(), translate_error)
    await nc.flush()  # the API's subscriptions are live on the server before anyone reads server.json

    server_info = {
        "natsUrl": url_without_credentials(nats_url), "pid": os.getpid(), "hostId": settings.host_id, "dataDir": str(settings.data_dir),
        **({"natsPid": embedded.pid, "natsPort": embedded.port} if embedded else {}),
    }
    write_server_file(settings.server_file, server_info)
    if ready:
        ready(server_info)

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await _until_stopped_or_failed(stop, tasks)
    finally:
        await service.stop()
        await agent_service.stop()
        await host_agent.stop()
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=5)
        await provisioner.stop()
        with contextlib.suppress(Exception):
            await nc.close()
        store.close()
        await read_model.close()
        if embedded:
            embedded.stop()
        settings.server_file.unlink(missing_ok=True)
        lock.close()


async def _until_stopped_or_failed(stop: asyncio.Event, tasks: list[asyncio.Task]) -> None:
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    for task in done:
        if task is not stopping and task.exception():
            raise task.exception()


async def _handle_thread_event(threads: ThreadHandlers, provisioner: Provisioner, message: Msg) -> None:
    """A refused event is logged by subject and reason, never its content (a prompt, a secret),
    and returns normally, so it is acknowledged: sending it again would not make it valid."""
    try:
        event = inbound_decoder.decode(message.data)
    except (msgspec.DecodeError, RecursionError) as malformed:  # RecursionError: nested too deep
        log.warning("refused a thread event on %s: %s", message.subject, refusal_reason(malformed))
        return
    subject_thread = message.subject.split(".")[2]
    if subject_thread != event.thread_id:
        log.warning("refused a thread event on %s: it names thread %s", message.subject, event.thread_id)
        return
    try:
        environment = await threads.handle(event)
    except (RequestError, DomainError) as refused:
        log.warning("refused a thread event on %s: %s", message.subject, refused)
        return
    if environment is not None:
        if isinstance(event, ThreadMessageMessage):
            provisioner.note_activity(environment.id)
        await provisioner.drive(environment.id)


def _decode_transcript(data: bytes) -> TranscriptLine:
    return msgspec.json.decode(data, type=TranscriptLine)
