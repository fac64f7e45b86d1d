"""Random interleavings of thread events always end consistent (hypothesis).

The real thread handlers and provisioning driver run in process against an in-memory event store
and a provider that creates and removes plain directories at once, so thousands of orderings of
created / message / archived / unarchived / message_cancelled can be tried in seconds.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bb_environments.bus.core.thread_consumer import thread_command
from bb_environments.bus.wire.thread_events import (
    MessageCancelledMessage,
    ProviderIntent,
    ThreadArchivedMessage,
    ThreadCreatedMessage,
    ThreadMessageMessage,
    ThreadUnarchivedMessage,
)
from bb_environments.domain.errors import DomainError
from bb_environments.domain.hook_operations import SCRIPT_NAMES, HookOutcome
from bb_environments.domain.request_errors import RequestError
from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.hooks.runner import CANCELLED_BEFORE_START
from bb_environments.providers.contract import READY, Created, Policy, Removed, Requires
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspaces import LocalWorkspaces
from tests.unit.one_machine import OneMachine

THREADS = ("a", "b", "c")
KINDS = ("created", "message", "archived", "unarchived", "message_cancelled", "pause")


class InstantProvider:
    id = "instant"
    display_name = "Instant"
    requires = Requires()
    policy = Policy(retire_grace_ms=0)
    inputs_type = None

    def availability(self, ctx):
        return READY

    def validate(self, ctx):
        pass

    def planned_path(self, ctx, path_key):
        return str(Path(ctx.data_dir) / "ws" / path_key)

    def create(self, ctx):
        path = Path(self.planned_path(ctx, ctx.path_key))
        path.mkdir(parents=True, exist_ok=True)
        return Created(path=str(path), owns_path=True)

    def remove(self, ctx):
        shutil.rmtree(Path(ctx.data_dir) / "ws" / ctx.path_key, ignore_errors=True)
        return Removed()


class Silent:
    def line(self, *args, **kwargs) -> None:
        pass


class HostWithoutScripts:
    """The host side of the hooks, for the instant provider's workspaces, which hold no scripts:
    like the real runner it answers that a hook was skipped, or cancelled if its cancel came
    first. The driver asks for each recorded operation at most once."""

    def __init__(self) -> None:
        self.asked: set[str] = set()
        self.tombstoned: set[str] = set()

    async def run_hook(self, host_id, environment_id, operation_id, kind, workspace, known=None):
        assert not (Path(workspace) / SCRIPT_NAMES[kind]).exists()
        assert operation_id not in self.asked, f"hook operation {operation_id} was asked for twice"
        self.asked.add(operation_id)
        await asyncio.sleep(0)  # the answer comes from another process
        if operation_id in self.tombstoned:
            return CANCELLED_BEFORE_START
        return HookOutcome("skipped", None, f"no {SCRIPT_NAMES[kind]}")

    async def cancel_hook(self, host_id, operation_id):
        self.tombstoned.add(operation_id)
        return "finished" if operation_id in self.asked else "never-started"


def message(kind: str, thread_id: str):
    """The command a thread event of `kind` becomes at the bus's edge."""
    intent = ProviderIntent(environment_provider_id="instant")
    return thread_command(
        {
            "created": lambda: ThreadCreatedMessage(thread_id=thread_id, environment=intent),
            "message": lambda: ThreadMessageMessage(thread_id=thread_id),
            "archived": lambda: ThreadArchivedMessage(thread_id=thread_id),
            "unarchived": lambda: ThreadUnarchivedMessage(thread_id=thread_id),
            "message_cancelled": lambda: MessageCancelledMessage(thread_id=thread_id),
        }[kind]()
    )


async def settle(provisioner: Provisioner, app: Environments) -> None:
    for _ in range(2000):
        await asyncio.sleep(0.001)
        if provisioner.busy:
            continue
        head = app.head()
        await provisioner.sweep()
        if app.head() == head and not provisioner.busy:
            return
    raise AssertionError("the provisioning driver never settled")


def check_consistent(app: Environments, root: Path) -> None:
    claims = {path: holder for _, path, holder in app.claims.live()}
    known_threads = [t for t in (app.find_thread(t) for t in THREADS) if t is not None]
    for environment_id in {t.environment_id for t in known_threads if t.environment_id}:
        environment = app.environment(environment_id)
        for thread_id in environment.thread_ids:
            assert app.thread(thread_id).status == "active"
        if environment.status == "removed":
            assert claims.get(environment.claimed_path) != environment.id
        else:
            assert claims[environment.claimed_path] == environment.id
    for thread_id in THREADS:
        thread = app.find_thread(thread_id)
        if thread and thread.status == "active" and thread.environment_id:
            environment = app.environment(thread.environment_id)
            assert thread_id in environment.thread_ids and environment.is_live


async def scenario(steps: list[tuple[str, str]], root: Path) -> None:
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 0)
    store = Store(app)
    workspaces = LocalWorkspaces(ProviderRegistry([InstantProvider()]), root, Silent())
    hosts = OneMachine(workspaces, HostWithoutScripts())
    placer = Placer(hosts)
    provisioner = Provisioner(store, placer, hosts, Silent())
    threads = ThreadHandlers(store, placer, hosts)
    try:
        for kind, thread_id in steps:
            if kind == "pause":
                await settle(provisioner, app)
                check_consistent(app, root)
                continue
            try:
                environment = await threads.handle(message(kind, thread_id))
            except (RequestError, DomainError):
                continue
            if environment is not None:
                await provisioner.drive(environment.id)
        await settle(provisioner, app)
        check_consistent(app, root)
        for thread_id in THREADS:
            if app.find_thread(thread_id):
                await threads.handle(message("archived", thread_id))
        await settle(provisioner, app)
        for environment_id in app.unfinished_environment_ids():
            raise AssertionError(
                f"environment {environment_id} outlived all its threads: {app.environment(environment_id).status}"
            )
        assert all(holder is None for _, _, holder in app.claims.live())
        workspaces = root / "providers" / "instant" / "ws"
        assert not workspaces.exists() or list(workspaces.iterdir()) == []
    finally:
        await provisioner.stop()
        store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(THREADS)), max_size=25))
def test_any_interleaving_of_thread_events_ends_consistent(steps):
    root = Path(tempfile.mkdtemp())
    try:
        asyncio.run(scenario(steps, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
