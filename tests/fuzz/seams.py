"""The service's inbound seams in process, with the real parts behind them.

Only NATS itself is stood in for, at its edge: a connection that delivers a publish to the
subscriptions of this process and a request to the endpoint of this process that serves its
subject (none: no responders), and nats.micro's `add_service`, whose endpoints register there.
A test hands an endpoint a real `nats.micro` Request. Everything behind that (decoding,
validation, handlers, the event store on an SQLite file, the read model, the placement with the
installed providers, the host agent with its HookRunner and the store-backed ledger) is the code
`bb serve` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from hypothesis import HealthCheck, settings
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.micro.request import Request

from bb_environments.bus.agent.host_service import start_host_service
from bb_environments.bus.core.api_endpoints import ApiEdge, translate_error
from bb_environments.bus.core.api_service import start_api
from bb_environments.bus.core.job_queue import HostJobQueue, HostLiveness
from bb_environments.bus.core.remote_host import RemoteHost
from bb_environments.bus.transcript_publisher import TranscriptPublisher
from bb_environments.bus.wire.api_messages import ERROR_CODE_HEADER, ErrorReply
from bb_environments.bus.wire.thread_events import ThreadMessageMessage
from bb_environments.domain.environment import Environment
from bb_environments.domain.hook_operations import RecordedHook
from bb_environments.entrypoints.bootstrap import Ports, build_core
from bb_environments.entrypoints.config import (
    REMOVED_RETENTION_S,
    SAVED_REF_RETENTION_S,
    THREADS_MAX_AGE_S,
    THREADS_MAX_BYTES,
    Settings,
)
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.handlers.ports import AgentSeed
from bb_environments.handlers.store import Store, StoreLedger
from bb_environments.hooks.guarded import GuardedHooks
from bb_environments.hooks.ledger import HookLedger
from bb_environments.hooks.local_host import LocalHost
from bb_environments.hooks.runner import HookRunner
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspaces import provider_dir
from tests.fuzz.strategies import CANARY

T = TypeVar("T")
HOST = "local"


class _OneHost:
    """The fuzzed world's hosts: this service's own, and none registered."""

    def seeded(self) -> dict[str, str]:
        return {}

    def new_seed(self) -> AgentSeed:
        raise AssertionError("the fuzzed requests register no host")

    async def admit(self, host_id: str, seed: AgentSeed) -> str:
        raise AssertionError("the fuzzed requests register no host")

    async def forget(self, host_id: str) -> None:
        raise AssertionError("the fuzzed requests remove no host")

    async def last_seen(self, host_id: str) -> datetime | None:
        return None


STORE_FILES = ("events.sqlite", "read-models.sqlite")
SETTLE_S = 30
"""Generous: a personal workspace is ready in milliseconds, but CI shares its cores."""
Handler = Callable[[Request], Awaitable[None]]


class Subscription:
    def __init__(self, nats: EdgeOfNats, subject: str, callback: Callable[[Msg], Awaitable[None]]) -> None:
        self._nats, self.subject, self.callback = nats, subject, callback

    async def unsubscribe(self) -> None:
        self._nats.subscriptions.remove(self)


class EdgeOfNats:
    """A NATS connection as this process alone sees it: what is published reaches the
    subscriptions made here, a request reaches the endpoint registered here for its subject."""

    max_payload = 1024 * 1024  # nats-server's default

    def __init__(self) -> None:
        self.subscriptions: list[Subscription] = []
        self.endpoints: dict[str, Handler] = {}
        self._inboxes = itertools.count()

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        for subscription in [s for s in self.subscriptions if s.subject == subject]:
            await subscription.callback(Msg(_client=self, subject=subject, reply=reply, data=payload, headers=headers))

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]], **_: Any) -> Subscription:
        subscription = Subscription(self, subject, cb)
        self.subscriptions.append(subscription)
        return subscription

    async def request(
        self, subject: str, payload: bytes = b"", timeout: float = 0.5, headers: dict[str, str] | None = None
    ) -> Msg:
        endpoint = self.endpoints.get(subject)
        if endpoint is None:
            raise NoRespondersError
        inbox, replies = f"_INBOX.{next(self._inboxes)}", []

        async def keep(reply: Msg) -> None:
            replies.append(reply)

        subscription = await self.subscribe(inbox, keep)
        try:
            await endpoint(Request(Msg(_client=self, subject=subject, reply=inbox, data=payload, headers=headers)))
        finally:
            await subscription.unsubscribe()
        assert len(replies) == 1, f"{subject} answered {len(replies)} times"
        return replies[0]

    def message(self, subject: str, data: bytes) -> Msg:
        """A message as a consumer is handed it."""
        return Msg(_client=self, subject=subject, data=data)


@dataclass
class Reply:
    """What a client reads from a micro-service reply, the way bus/api_client/nats_client.py reads it."""

    code: str | None
    """The micro-service error code; None for an answer."""
    message: str | None
    """The error's description header (the API also sends an error document, in `data`)."""
    data: bytes


class MicroEndpoints:
    """nats.micro's add_service and Service: each endpoint is registered with the edge of NATS."""

    def __init__(self, nats: EdgeOfNats) -> None:
        self._nats = nats

    async def add_service(self, nc: Any, **config: Any) -> MicroEndpoints:
        return self

    async def add_endpoint(self, name: str, subject: str, handler: Handler, **_: Any) -> None:
        self._nats.endpoints[subject] = handler

    async def stop(self) -> None:
        pass

    async def ask(self, subject: str, data: bytes) -> Reply:
        """Send a request as a client would, and read its one reply."""
        reply = await self._nats.request(subject, data)
        return Reply(
            (reply.headers or {}).get(ERROR_CODE_HEADER), (reply.headers or {}).get("Nats-Service-Error"), reply.data
        )

    def api_error(self, reply: Reply) -> tuple[str, str]:
        error = msgspec.json.decode(reply.data, type=ErrorReply).error
        return error.code, error.message


class LogLines(logging.Handler):
    """Every log line written while it is installed, as the operator would read it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, logger_prefix: str = "") -> list[str]:
        return [r.getMessage() for r in self.records if r.name.startswith(logger_prefix)]

    @contextmanager
    def installed(self) -> Iterator[LogLines]:
        root = logging.getLogger()
        level = root.level
        root.addHandler(self)
        root.setLevel(logging.INFO)  # what `bb serve` logs; DEBUG would cost each example aiosqlite's chatter
        try:
            yield self
        finally:
            root.removeHandler(self)
            root.setLevel(level)


def files_under(
    root: Path, ignore: Callable[[str], bool] = lambda path: False, prune: tuple[Path, ...] = ()
) -> set[str]:
    """Everything under `root` (but not under `prune`), as relative paths: a refused input must
    leave this as it was. Plain strings: this runs for every example."""
    found, start, pruned = set(), len(str(root)) + 1, {str(p) for p in prune}
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if os.path.join(directory, d) not in pruned]
        for name in subdirectories + names:
            path = os.path.join(directory, name)
            if not ignore(path):
                found.add(path[start:])
    return found


def working_directory() -> set[str]:
    """What a relative path in a hostile input would land in; hypothesis keeps its examples here too."""
    return set(os.listdir()) - {".hypothesis", ".pytest_cache"}


def store_file(path: str) -> bool:
    """The SQLite files themselves: they change on every read (WAL), not only on a write."""
    return os.path.basename(path).startswith(STORE_FILES)


def one_sentence(message: str | None) -> bool:
    """A refusal an operator can read: something, on one line by any reader's measure (a log
    viewer's, a terminal's: str.splitlines knows them all), and not a Python traceback."""
    return (
        bool(message and message.strip())
        and len(message.splitlines()) == 1
        and "\r" not in message
        and "Traceback" not in message
    )


class Loop:
    """One event loop per world: the store's threads, the read model and the provisioner outlive an example."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        pending = asyncio.all_tasks(self.loop)  # transcript lines still queued, say
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


def world_settings(data_dir: Path) -> Settings:
    """`bb serve`'s settings for a data dir, whatever BB_* variables the test runs with."""
    return Settings(
        data_root=str(data_dir),
        nats_url=None,
        event_store=f"sqlite:///{data_dir / 'events.sqlite'}",
        host_id=HOST,
        retire_grace_override=None,
        hook_timeout_s=5,
        sweep_interval_s=30,
        transient_retry_s=30,
        extra_providers=(),
        threads_max_age_s=THREADS_MAX_AGE_S,
        threads_max_bytes=THREADS_MAX_BYTES,
        removed_retention_s=REMOVED_RETENTION_S,
        saved_ref_retention_s=SAVED_REF_RETENTION_S,
    )


def open_event_store(data_dir: Path) -> Environments:
    return Environments(
        env=event_store_environment(f"sqlite:///{data_dir / 'events.sqlite'}"), grace_for=lambda provider_id: 300_000
    )


@dataclass(frozen=True)
class Seeded:
    """What a service world holds before any example: ids a hostile input can aim at."""

    ready_environment: str
    removed_environment: str
    thread_ids: tuple[str, ...]
    project_dirs: tuple[str, ...]


class ServiceWorld(Loop):
    """`bb serve`'s thread handlers and API in process, on an SQLite event store and read model.

    Any example that changed the store (an accepted spawn, an archive) is followed by a reset to
    the seeded state, so every example meets the same world and a failure replays exactly.
    """

    def __init__(self, root: Path, registry: ProviderRegistry, micro: MicroEndpoints, nats: EdgeOfNats) -> None:
        super().__init__()
        self.root, self.data_dir, self._pristine = root, root / "data", root / "pristine"
        self.registry, self.micro, self.nats = registry, micro, nats
        self.markers = root / "markers"
        self.markers.mkdir(parents=True)
        self.data_dir.mkdir(mode=0o700, parents=True)
        # Where `bb serve` keeps them, so that a reset takes the records of accepted examples too.
        self.hooks = HookRunner(self.data_dir / "hooks", 5)
        self._open()
        self.seeded = self._seed()
        self.run(self.api.replay())
        self._close()
        shutil.copytree(self.data_dir, self._pristine)
        self._open()

    def _open(self) -> None:
        self._started = contextlib.AsyncExitStack()
        # The core as `bb serve` builds it; its ports to the bus go through the edge of NATS.
        # The fuzzed world places nothing on another host: no job is ever queued, so no JetStream.
        jobs = HostJobQueue(self.nats, None, HostLiveness(None))  # type: ignore[arg-type]
        transcript = TranscriptPublisher(self.nats, self.loop)

        def host_here(ledger: HookLedger) -> LocalHost:
            return LocalHost(
                self.registry,
                self.data_dir,
                transcript,
                hooks=GuardedHooks(self.hooks, HOST, TranscriptPublisher(self.nats, self.loop), ledger),
            )

        core = self.run(
            build_core(
                world_settings(self.data_dir),
                self.registry,
                Ports(
                    RemoteHost(self.nats, jobs),
                    _OneHost(),
                    transcript,
                    self._stream_position,
                    self._publish_thread_message,
                    here=host_here,
                ),
                self._started,
            )
        )
        self.app, self.store, self.read_model = core.app, core.store, core.read_model
        self.placer, self.threads, self.provisioner, self.api = core.placer, core.threads, core.provisioner, core.api
        # The core runs this host's hooks in process, and its agent answers the bus, as in `bb serve`.
        assert core.here is not None
        self.here = core.here
        self.run(start_host_service(self.nats, HOST, self.here))
        self.run(
            start_api(
                self.nats,
                ApiEdge(
                    self.api, core.machines, core.secrets, core.pools, self.nats.max_payload, _no_replicas
                ).endpoints(),
                translate_error,
            )
        )

    async def _stream_position(self) -> int:
        return 0

    async def _publish_thread_message(self, thread_id: str, text: str, occurred_at: Any) -> None:
        message = ThreadMessageMessage(thread_id=thread_id, text=text, occurred_at=occurred_at)
        await self.nats.publish(f"bb.threads.{message.thread_id}.message", msgspec.json.encode(message))

    def _close(self) -> None:
        self.run(self._started.aclose())

    def close(self) -> None:
        self._close()
        self.run(self.here.hooks.stop())  # the hook runner's too, which a reset keeps
        super().close()

    def head(self) -> int:
        return self.app.head()

    def settle(self) -> None:
        """Let the provisioning an accepted request started finish (a personal workspace: quick)."""
        if not self.provisioner.busy:
            return
        stable, deadline = 0, time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            head = self.head()
            self.run(asyncio.sleep(0.002))
            stable = stable + 1 if not self.provisioner.busy and self.head() == head else 0
            if stable >= 3:
                return
        raise AssertionError(f"provisioning did not settle within {SETTLE_S} s")

    def reset(self) -> None:
        self.settle()
        self._close()
        shutil.rmtree(self.data_dir)
        shutil.copytree(self._pristine, self.data_dir)
        self._open()

    def files(self) -> set[str]:
        return files_under(self.root, store_file, prune=(self._pristine,))

    def check_what_was_kept(self, head: int, seeded_files: set[str]) -> None:
        """After one example: with nothing written no file changed; with something written, no
        canary (a prompt, an undeclared field) is in the store; then start again from the seed."""
        if self.head() == head:
            now = self.files()
            assert now == seeded_files, (
                f"with nothing written, {sorted(now - seeded_files)} appeared and {sorted(seeded_files - now)} went"
            )
        else:
            assert CANARY.encode() not in self.store_bytes(), (
                "a prompt, a message's text or an undeclared field was stored"
            )
            self.reset()

    def store_bytes(self) -> bytes:
        """The event store as it lies on disk, write-ahead log included: what it keeps, whatever its form."""
        return b"".join(path.read_bytes() for path in sorted(self.data_dir.glob("events.sqlite*")))

    def _seed(self) -> Seeded:
        app, now = self.app, datetime.now(UTC)
        intent = {"type": "provider", "environmentProviderId": "personal-workspace", "machine": None, "inputs": None}
        ready = self._workspace_environment("seeded-ready", intent)
        removed = self._workspace_environment("seeded-gone", intent)
        app.archive_thread("seeded-gone", now)
        app.request_deletion(removed.id)
        app.start_removal(removed.id, now)
        app.skip_teardown(removed.id, "seeded")
        app.record_removed(removed.id, app.environment(removed.id).removal_attempt)
        app.register_thread("seeded-orphan", None, None, HOST, None)  # no intent, no parent: a first message is refused
        # A directory anyone on the machine could make: its name is the hostile value here.
        projects = [
            self.root / "projects" / "plain",
            self.root / "projects" / "with-hooks",
            self.root / "projects" / "line\nbreak --upload-pack=x",
        ]
        projects[0].mkdir(parents=True)
        planted_hooks(projects[1], self.markers)
        projects[2].mkdir()
        return Seeded(
            str(ready.id), str(removed.id), ("seeded-ready", "seeded-gone", "seeded-orphan"), tuple(map(str, projects))
        )

    def _workspace_environment(self, thread_id: str, intent: dict) -> Environment:
        app = self.app
        workspace = provider_dir(self.data_dir, "personal-workspace") / "workspaces" / thread_id
        workspace.mkdir(parents=True)
        app.register_thread(thread_id, None, None, HOST, intent)
        environment = app.answer_first_message(
            thread_id, Placement("personal-workspace", HOST, None, None, thread_id, str(workspace))
        )
        created = app.record_created(environment.id, environment.attempt, str(workspace), True, None, None)
        return app.record_setup_skipped(environment.id, created.setup_operation_id, "seeded")


def planted_hooks(directory: Path, markers: Path) -> None:
    """Hook scripts that would leave a marker behind if anything ever ran them."""
    directory.mkdir(parents=True, exist_ok=True)
    for kind in ("setup", "teardown"):
        (directory / f".bb-env-{kind}.sh").write_text(f"touch '{markers}/{directory.name}-{kind}'\n")


class HostAgentWorld(Loop):
    """The host agent of host `local` with a HookRunner on a temp dir and the store-backed ledger,
    over a log that recorded hook operations in every state a request can aim at."""

    def __init__(self, root: Path, micro: MicroEndpoints, nats: EdgeOfNats) -> None:
        super().__init__()
        self.root, self.micro = root, micro
        self.markers, self.hooks_dir = root / "markers", root / "hooks"
        self.markers.mkdir(parents=True)
        self.app = open_event_store(root / "data")
        self.store = Store(self.app)
        self.recorded = self._seed()
        self.planted = [str(root / "planted" / name) for name in ("a", "b")]
        for directory in self.planted:
            planted_hooks(Path(directory), self.markers)
        transcript = TranscriptPublisher(nats, self.loop)
        self.host = LocalHost(
            ProviderRegistry([]),
            root / "workspaces",
            transcript,
            hooks=GuardedHooks(HookRunner(self.hooks_dir, 5), HOST, transcript, StoreLedger(self.store)),
        )
        self.service = self.run(start_host_service(nats, HOST, self.host))

    def close(self) -> None:
        self.run(self.service.stop())
        self.run(self.host.hooks.stop())
        self.store.close()
        super().close()

    def head(self) -> int:
        return self.app.head()

    def _seed(self) -> list[RecordedHook]:
        """An awaited setup; one of another host; a finished one; one whose environment was
        cancelled while it ran (stoppable); an awaited teardown."""
        app, now = self.app, datetime.now(UTC)
        awaited = self._setup_started("awaited", HOST)
        elsewhere = self._setup_started("elsewhere", "elsewhere")
        finished = self._setup_started("finished", HOST)
        app.record_setup_outcome(finished.id, finished.setup_operation_id, True, None)
        cancelled = self._setup_started("cancelled", HOST)
        app.archive_thread("cancelled", now)
        torn = self._setup_started("teardown", HOST)
        app.record_setup_outcome(torn.id, torn.setup_operation_id, True, None)
        app.archive_thread("teardown", now)
        app.request_deletion(torn.id)
        app.start_removal(torn.id, now)
        torn, _ = app.start_teardown(torn.id)
        operations = [e.setup_operation_id for e in (awaited, elsewhere, finished, cancelled)]
        recorded = [app.recorded_hook(op) for op in [*operations, torn.teardown_operation_id]]
        assert all(recorded) and [r.awaited for r in recorded] == [True, True, False, True, True]
        return recorded

    def _setup_started(self, name: str, host_id: str) -> Environment:
        app = self.app
        workspace = self.root / "workspaces" / name
        planted_hooks(workspace, self.markers)
        app.register_thread(name, None, None, host_id, None)
        environment = app.claim_environment(name, "personal-workspace", host_id, None, None, name, str(workspace))
        app.record_created(environment.id, environment.attempt, str(workspace), True, None, None)
        return app.start_setup(environment.id)[0]


EXAMPLES = 1000
"""Per inbound family, in every CI run (issue 7): enough to meet each hostile value in many shapes."""


def fuzz_settings(**overrides: Any) -> settings:
    # Huge and deeply nested payloads are the point, and one world serves every example.
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        **overrides,
    )


async def _no_replicas() -> list:
    """This core enters no presence: the fuzzed steps never ask for the replicas."""
    return []
