"""The core replica's composition root: built one way for `bb serve`, the tests and the benches.

The core is the event store, its writer (`Store`), the read models, the providers' placement, the
thread handlers, the provisioner and the API's handlers (`build_core`). It reaches the bus only
through the ports it is given, so a test hands it stand-ins; `bb serve` hands it NATS and adds the
core's loops on the bus (`relay_of`, `core_workers`). The host agent is composed apart
(entrypoints/agent.py), so that it can run without any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from eventsourcing.persistence import IntegrityError, InternalError
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from bb_environments.bus.core.log_follower import LogFollower, TranscriptFollower
from bb_environments.bus.core.log_reader import LogReader
from bb_environments.bus.core.partition_mirror import keep_mirroring
from bb_environments.bus.core.placements import Placements
from bb_environments.bus.core.relay import AckedPublisher, OutboxRelay
from bb_environments.bus.core.replicas import ActivityAcrossReplicas, DriveShare, Lease, while_leased
from bb_environments.bus.core.sweep import sweep_forever
from bb_environments.bus.core.thread_consumer import ThreadEventConsumer
from bb_environments.bus.core.transcript_intake import TranscriptIntake
from bb_environments.bus.health import BusHealth
from bb_environments.bus.jetstream import JetStream, consume, follow
from bb_environments.bus.wire import subjects
from bb_environments.domain.leases import PortRange
from bb_environments.entrypoints.config import Settings, event_store_file, hook_limits, run_hooks_as
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.entrypoints.stalled_writers import end_stalled_holders_forever
from bb_environments.handlers.api import Api
from bb_environments.handlers.application import Environments
from bb_environments.handlers.disk_usage import DiskScanner, measure_forever
from bb_environments.handlers.doctor import Doctor
from bb_environments.handlers.hosts import HostRouter
from bb_environments.handlers.indexes import LiveLimits
from bb_environments.handlers.machines import Machines
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.pool_keeper import PoolKeeper
from bb_environments.handlers.pools import Pools
from bb_environments.handlers.ports import (
    ActivityElsewhere,
    Everything,
    Host,
    HostDirectory,
    NoOtherReplica,
    Share,
    Transcript,
)
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.secrets import Secrets
from bb_environments.handlers.store import Store, StoreLedger
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.handlers.writers import SharedStore, SingleWriter
from bb_environments.hooks.ledger import HookLedger
from bb_environments.hooks.local_host import LocalHost
from bb_environments.projections.read_model import ReadModel
from bb_environments.projections.tables import TRANSCRIPT
from bb_environments.providers.contract import retire_grace_ms
from bb_environments.providers.git_worktree import GitWorktreeProvider
from bb_environments.providers.host.containment import host_containment
from bb_environments.providers.host.secret_store import SecretStore
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.saved_work import saved_notes_dir
from bb_environments.providers.workspaces import provider_dir

# Whether a cached aggregate is read again from the store on a hit is the writers' strategy's
# (handlers/writers.py): with one writer it never is.
AGGREGATE_CACHE = {"AGGREGATE_CACHE_MAXSIZE": "10000"}
TABLES_RACED = 5
"""How often a start tries to open a new PostgreSQL store whose tables other replicas make at once."""


class StoreUnusable(RuntimeError):
    """The event store cannot be opened; the message names it (never its password)."""


@dataclass(frozen=True)
class Ports:
    """Where the core reaches the world: the hosts whose agents run elsewhere (`remote`), the
    registered hosts, the transcript, the environments stream's position, and the threads' first
    messages; and `here`, which makes the host whose agent runs in this process once the core has
    the log its hooks ask (None: `--no-agent`, every host's agent runs elsewhere)."""

    remote: Host
    hosts: HostDirectory
    transcript: Transcript
    stream_position: Callable[[], Awaitable[int]]
    publish_thread_message: Callable[[str, str, datetime], Awaitable[None]]
    here: Callable[[HookLedger], LocalHost] | None = None
    share: Share = Everything()
    """The environments this replica drives (bus/core/replicas.py DriveShare, when several share the store)."""
    activity_elsewhere: ActivityElsewhere = NoOtherReplica()
    """Where activity on an environment another replica drives is told (bus/core/replicas.py)."""


@dataclass(frozen=True)
class Replication:
    """What a replica among several on one store runs besides the core (bus/core/replicas.py)."""

    share: DriveShare
    relay_lease: Lease
    transcript_intake_lease: Lease
    activity: ActivityAcrossReplicas


@dataclass(frozen=True)
class Core:
    app: Environments
    store: Store
    read_model: ReadModel
    read_model_damage: str | None
    """Why the read models were set aside and started empty (None: they opened as they were)."""
    placer: Placer
    threads: ThreadHandlers
    provisioner: Provisioner
    doctor: Doctor
    api: Api
    machines: Machines
    pools: Pools
    here: LocalHost | None
    """This service's own host, when its agent runs in this process (its workspaces and hooks)."""
    log_reader: LogReader
    """The log as the relay publishes it and the log follower checks it: one reader, so that the
    follower finds each document the relay of this replica made a moment before, not read again."""
    secrets: Secrets
    """The projects' secrets (SPEC 11): their names in the log, their values in this data dir."""
    disk: DiskScanner


async def build_core(
    settings: Settings, registry: ProviderRegistry, ports: Ports, started: contextlib.AsyncExitStack
) -> Core:
    """The core, each part's closing pushed on `started` (so the last built is the first closed)."""

    profiles = registry.profiles()

    def grace_for(provider_id: str) -> int | None:
        profile = profiles.get(provider_id)
        return retire_grace_ms(profile.policy if profile else None, settings.retire_grace_override)

    # A SQLite store has one writer, serve's lock beside it says which; a PostgreSQL one may be shared.
    writers = SingleWriter() if event_store_file(settings.event_store) else SharedStore()
    for attempt in range(1, TABLES_RACED + 1):
        try:
            app = Environments(
                env={**event_store_environment(settings.event_store), **AGGREGATE_CACHE},
                grace_for=grace_for,
                writers=writers,
                limits=LiveLimits(
                    settings.max_live_environments,
                    settings.max_live_environments_per_project,
                    settings.max_disk_bytes_per_project,
                ),
                ports=PortRange(*settings.port_range, settings.ports_per_environment),
            )
            app.pool_max_failures = settings.pool_max_failures
            break
        except (IntegrityError, InternalError):
            # Replicas starting together on a new database each create its tables: PostgreSQL lets
            # one win and fails the others' CREATE ("tuple concurrently updated", a duplicate
            # type). Asked again, the tables are there.
            if attempt == TABLES_RACED:
                raise StoreUnusable(
                    f"the event store named by BB_EVENT_STORE cannot be opened: its tables "
                    f"could not be made in {TABLES_RACED} attempts"
                ) from None
            await asyncio.sleep(0.2 * attempt)
        except Exception as unusable:
            store_name = event_store_file(settings.event_store) or "named by BB_EVENT_STORE"  # never its password
            raise StoreUnusable(f"the event store {store_name} cannot be opened: {unusable}") from None
    store = Store(app)
    started.callback(store.close)
    read_model, damage = await ReadModel.open_or_set_aside(settings.data_dir / "read-models.sqlite")
    started.push_async_callback(read_model.close)
    secrets = Secrets(store, SecretStore(settings.data_dir / "secrets"), settings.project_roots)
    here = ports.here(StoreLedger(store, secrets.for_hook)) if ports.here else None
    # The cloud providers' work is the core's, under its data dir: the host here's own when its
    # workspaces lie there too (no BB_AGENT_ROOT), sharing one containment of hooks' processes.
    core_host = (
        here
        if here is not None and not settings.agent_root
        else LocalHost(
            registry,
            settings.data_dir,
            ports.transcript,
            containment=host_containment(settings.data_dir / "containment", hook_limits(settings)),
            workspace_user=run_hooks_as(settings),
        )
    )
    hosts = HostRouter(registry, core_host, ports.remote, here, settings.host_id)
    machines = Machines(store, ports.hosts, read_model, settings.host_id, agent_here=here is not None)
    await machines.record_seeded_hosts()
    placer = Placer(
        hosts,
        settings.host_id,
        machines.known,
        settings.project_roots,
        default_host=settings.default_host,
        agent_here=here is not None,
    )
    disk = DiskScanner(store, hosts, ports.share)
    provisioner = Provisioner(
        store,
        placer,
        hosts,
        ports.transcript,
        timedelta(seconds=settings.transient_retry_s),
        share=ports.share,
        activity_elsewhere=ports.activity_elsewhere,
        measure_soon=disk.measure_soon,
    )
    started.push_async_callback(provisioner.stop)
    threads = ThreadHandlers(store, placer, hosts)
    provisioner.place_again = threads.place_waiting
    doctor = Doctor(store, hosts, provisioner, settings.host_id, machines.known)
    api = Api(
        store,
        read_model,
        placer,
        hosts,
        threads,
        provisioner,
        doctor,
        settings.host_id,
        ports.stream_position,
        ports.publish_thread_message,
        lambda: LogReader(app),
        grace_for,
    )
    pools = Pools(store, placer, PoolKeeper(store, placer, provisioner))
    return Core(
        app,
        store,
        read_model,
        damage,
        placer,
        threads,
        provisioner,
        doctor,
        api,
        machines,
        pools,
        here,
        LogReader(app),
        secrets,
        disk,
    )


async def relay_of(core: Core, js: JetStreamContext, nc: Client, health: BusHealth, replicated: bool) -> OutboxRelay:
    """The outbox relay of the core's store onto the environments stream, woken by every save of
    this service; (`replicated`) core_workers adds the wake-ups from the other replicas' saves."""
    log_reader = core.log_reader
    relay = OutboxRelay(
        js,
        AckedPublisher(nc),
        lambda after: core.store.read_log(log_reader.page, after),
        lambda ids: core.store.read_log(log_reader.at, ids),
        health=health,
    )
    if not replicated:
        loop = asyncio.get_running_loop()
        core.app.on_saved = lambda: loop.call_soon_threadsafe(relay.wake)
    return relay


def _woken_across_replicas(
    core: Core, relay: OutboxRelay, nc: Client, relay_lease: Lease
) -> Callable[[], Coroutine[Any, Any, None]]:
    """The relay's run while this replica holds the relay lease, woken by every save: its own
    directly, another replica's by that replica's word on the bus. Only the holder listens, and a
    holder's own saves are not told: every other replica would otherwise be sent a message per
    save of every replica, for a relay it does not run."""
    loop = asyncio.get_running_loop()

    async def tell_the_holder() -> None:
        with contextlib.suppress(Exception):  # the relay's poll reads it all the same
            await nc.publish(subjects.LOG_GREW)

    def grew() -> None:
        relay.wake()
        if not relay_lease.held:
            loop.create_task(tell_the_holder())

    async def wake(_: Msg) -> None:
        relay.wake()

    async def relaying() -> None:
        told = await nc.subscribe(subjects.LOG_GREW, cb=wake)
        try:
            await relay.run(still_leased=relay_lease.confirmed)
        finally:
            with contextlib.suppress(Exception):
                await told.unsubscribe()

    core.app.on_saved = lambda: loop.call_soon_threadsafe(grew)
    return relaying


def core_workers(
    core: Core,
    relay: OutboxRelay,
    js: JetStream,
    health: BusHealth,
    settings: Settings,
    replication: Replication | None = None,
) -> list[Coroutine[Any, Any, None]]:
    """The core's loops on the bus: the relay, the log and transcript followers, the hosts'
    transcript intake, one in-order consumer per thread partition, and the sweep; with
    `replication`, the relay and the intake run only while this replica holds their leases, the
    followers are this replica's own, its share of the environments is kept, and the relay's
    holder keeps the thread partitions' mirror mirroring."""
    placements = Placements(js, core.store)
    follower = LogFollower(core.store, core.log_reader, core.read_model, placements, core.provisioner)
    thread_events = ThreadEventConsumer(core.threads, placements, core.provisioner)
    transcripts = TranscriptFollower(core.read_model)
    intake = TranscriptIntake(AckedPublisher(js.nc), lambda ids: core.store.run(core.store.app.environment_hosts, ids))

    def taking_in() -> Coroutine[Any, Any, None]:
        return consume(
            js,
            subjects.TRANSCRIPT_INTAKE_STREAM,
            subjects.TRANSCRIPT_INTAKE_CONSUMER,
            subjects.HOST_TRANSCRIPTS,
            intake.handle_batch,
            health,
        )

    if replication is None:
        relaying = relay.run()
        followers = [
            consume(
                js,
                subjects.ENVIRONMENTS_STREAM,
                subjects.LOG_CONSUMER,
                subjects.LOG_EVENTS,
                follower.handle_batch,
                health,
            ),
            consume(
                js,
                subjects.TRANSCRIPTS_STREAM,
                subjects.TRANSCRIPTS_CONSUMER,
                subjects.TRANSCRIPT_EVENTS,
                transcripts.handle_batch,
                health,
            ),
            taking_in(),
        ]
    else:
        # Another replica relaying has caught the stream up as far as this one would.
        relaying = while_leased(
            replication.relay_lease,
            _woken_across_replicas(core, relay, js.nc, replication.relay_lease),
            health,
            on_others=relay.caught_up.set,
        )

        async def followed(messages: list[Msg]) -> None:
            await follower.handle_batch(messages)
            await core.read_model.note_followed(messages[-1].metadata.sequence.stream)

        async def transcript_position() -> int:
            return (await core.read_model.stored_position(TRANSCRIPT))[1]

        followers = [
            follow(
                js,
                subjects.ENVIRONMENTS_STREAM,
                subjects.LOG_EVENTS,
                core.read_model.followed,
                followed,
                health,
                "log follower",
            ),
            follow(
                js,
                subjects.TRANSCRIPTS_STREAM,
                subjects.TRANSCRIPT_EVENTS,
                transcript_position,
                transcripts.handle_batch,
                health,
                "transcript follower",
            ),
            replication.share.run(health, core.provisioner.sweep, core.provisioner.let_go),
            # One replica at a time, so that a host's lines keep their order.
            while_leased(replication.transcript_intake_lease, taking_in, health),
            keep_mirroring(js, health, lambda: replication.relay_lease.held),
        ]
    return [
        relaying,
        *followers,
        # A thread's events are handled in the order they were sent, one at a time, by its
        # partition's consumer; the partitions run side by side.
        *(
            consume(
                js,
                subjects.THREAD_PARTITIONS_STREAM,
                subjects.thread_partition_consumer(partition),
                subjects.thread_partition(partition),
                thread_events.handle_batch,
                health,
                in_order=True,
            )
            for partition in range(subjects.THREAD_PARTITIONS)
        ),
        core.pools.keeper.run(),
        sweep_forever(
            relay.caught_up,
            core.threads,
            core.provisioner,
            js,
            core.read_model,
            settings.removed_retention_s,
            settings.sweep_interval_s,
            saved_notes_dir(provider_dir(settings.workspaces_root, GitWorktreeProvider.id)),
            settings.saved_ref_retention_s,
            core.doctor,
            settings.doctor_interval_s,
        ),
        measure_forever(core.disk, settings.disk_scan_interval_s),
        core.disk.measure_settled_forever(),
        *([] if event_store_file(settings.event_store) else [end_stalled_holders_forever(core.app)]),
    ]
