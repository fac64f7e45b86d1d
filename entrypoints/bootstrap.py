"""The service's core, built one way for `bb serve` and for the tests that run it in process.

The core is the event store, its writer (`Store`), the read models, the providers' placement, the
thread handlers, the provisioner and the API's handlers. It reaches the bus only through the ports
it is given, so `bb serve` wires NATS around it (serve.py) and a test its stand-ins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bb_environments.bus.core.log_reader import LogReader
from bb_environments.handlers.application import Environments
from bb_environments.entrypoints.config import Settings, event_store_environment, event_store_file
from bb_environments.handlers.api import Api
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.ports import Hooks, Transcript
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.projections.read_model import ReadModel
from bb_environments.providers.contract import retire_grace_ms
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspaces import LocalWorkspaces

# One writer per store (serve's lock file beside it, and the Store's one writer thread), so the
# cache of aggregates is safe without reading the store again on every hit (fast-forwarding):
# nobody else can have written an aggregate's events since the writer cached what it saved.
AGGREGATE_CACHE = {"AGGREGATE_CACHE_MAXSIZE": "10000", "AGGREGATE_CACHE_FASTFORWARD": "n"}


class StoreUnusable(RuntimeError):
    """The event store cannot be opened; the message names it (never its password)."""


@dataclass(frozen=True)
class Ports:
    """Where the core reaches the bus: the hosts' agents, the transcript, the environments stream's
    position, and the threads' first messages."""

    hooks: Hooks
    transcript: Transcript
    stream_position: Callable[[], Awaitable[int]]
    publish_thread_message: Callable[[str, str, datetime], Awaitable[None]]


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
    api: Api


async def bootstrap(settings: Settings, registry: ProviderRegistry, ports: Ports,
                    started: contextlib.AsyncExitStack) -> Core:
    """The core, each part's closing pushed on `started` (so the last built is the first closed)."""

    workspaces = LocalWorkspaces(registry, settings.data_dir, ports.transcript)

    def grace_for(provider_id: str) -> int | None:
        profile = workspaces.profiles(settings.host_id).get(provider_id)
        return retire_grace_ms(profile.policy if profile else None, settings.retire_grace_override)

    try:
        app = Environments(env={**event_store_environment(settings.event_store), **AGGREGATE_CACHE},
                           grace_for=grace_for)
    except Exception as unusable:
        store_name = event_store_file(settings.event_store) or "named by BB_EVENT_STORE"  # never its password
        raise StoreUnusable(f"the event store {store_name} cannot be opened: {unusable}") from None
    store = Store(app)
    started.callback(store.close)
    read_model, damage = await ReadModel.open_or_set_aside(settings.data_dir / "read-models.sqlite")
    started.push_async_callback(read_model.close)
    placer = Placer(workspaces, settings.host_id)
    provisioner = Provisioner(store, placer, workspaces, ports.hooks, ports.transcript,
                              timedelta(seconds=settings.transient_retry_s))
    started.push_async_callback(provisioner.stop)
    threads = ThreadHandlers(store, placer, workspaces, settings.host_id)
    api = Api(store, read_model, placer, workspaces, threads, provisioner, settings.host_id, ports.stream_position,
              ports.publish_thread_message, lambda: LogReader(app))
    return Core(app, store, read_model, damage, placer, threads, provisioner, api)
