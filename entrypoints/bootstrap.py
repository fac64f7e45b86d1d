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
from bb_environments.handlers.writers import SharedStore, SingleWriter
from bb_environments.projections.read_model import ReadModel
from bb_environments.providers.registry import ProviderRegistry

DEFAULT_RETIRE_GRACE_MS = 300_000
"""The grace of an environment whose provider is no longer installed."""

# Whether a cached aggregate is read again from the store on a hit is the writers' strategy's
# (handlers/writers.py): with one writer it never is.
AGGREGATE_CACHE = {"AGGREGATE_CACHE_MAXSIZE": "10000"}


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

    def grace_for(provider_id: str) -> int | None:
        """The provider's grace; BB_RETIRE_GRACE_MS replaces it, except for providers that never retire."""
        provider = registry.get(provider_id)
        grace = provider.policy.retire_grace_ms if provider else DEFAULT_RETIRE_GRACE_MS
        if grace is None or settings.retire_grace_override is None:
            return grace
        return settings.retire_grace_override[0]

    # A SQLite store has one writer, serve's lock beside it says which; a PostgreSQL one may be shared.
    writers = SingleWriter() if event_store_file(settings.event_store) else SharedStore()
    try:
        app = Environments(env={**event_store_environment(settings.event_store), **AGGREGATE_CACHE},
                           grace_for=grace_for, writers=writers)
    except Exception as unusable:
        store_name = event_store_file(settings.event_store) or "named by BB_EVENT_STORE"  # never its password
        raise StoreUnusable(f"the event store {store_name} cannot be opened: {unusable}") from None
    store = Store(app)
    started.callback(store.close)
    read_model, damage = await ReadModel.open_or_set_aside(settings.data_dir / "read-models.sqlite")
    started.push_async_callback(read_model.close)
    placer = Placer(registry, settings.data_dir, settings.host_id)
    provisioner = Provisioner(store, placer, ports.hooks, ports.transcript,
                              timedelta(seconds=settings.transient_retry_s))
    started.push_async_callback(provisioner.stop)
    threads = ThreadHandlers(store, placer, settings.host_id)
    api = Api(store, read_model, placer, threads, provisioner, settings.host_id, ports.stream_position,
              ports.publish_thread_message, lambda: LogReader(app))
    return Core(app, store, read_model, damage, placer, threads, provisioner, api)
