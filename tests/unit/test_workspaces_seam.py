"""The core's handlers drive an environment through any Host port, not only this machine's:
a stand-in host whose workspaces exist nowhere on this filesystem takes a thread from spawn to
ready to removed, asked for each step by environment id and attempt."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.handlers.application import Environments
from bb_environments.handlers.commands import NewEnvironment, RegisterThread
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.provisioning import Provisioner
from bb_environments.handlers.store import Store
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.providers.contract import (
    Availability,
    Created,
    CreateResult,
    Policy,
    Removed,
    RemoveFailed,
    RemoveResult,
    Requires,
)
from bb_environments.providers.registry import ProviderDescription, ProviderProfile
from bb_environments.providers.workspace_messages import (
    CreateRequest,
    LeftoverRemoval,
    PauseFailed,
    PauseResult,
    Plan,
    PlanRequest,
    RemoveRequest,
    ResourceRequest,
    ResumeFailed,
    ResumeResult,
    Survey,
    SurveyRequest,
)
from tests.unit.one_machine import OneMachine
from tests.unit.test_local_workspaces import Lines

WORKSPACE = "/elsewhere/workspaces/t1"
PROFILE = ProviderProfile(
    id="far",
    display_name="Far away",
    requires=Requires(),
    inputs=None,
    policy=Policy(retire_grace_ms=0),
    pausable=False,
)


class FarHost:
    """A host whose workspaces the core never sees: it answers from what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []

    def profiles(self, host_id: str) -> Mapping[str, ProviderProfile]:
        return {PROFILE.id: PROFILE}

    async def providers(self, host_id: str) -> list[ProviderDescription]:
        return [ProviderDescription.of(PROFILE, Availability("ready"))]

    async def inputs(self, host_id: str, provider_id: str, inputs: Any) -> Any:
        return inputs

    async def canonical_project(self, host_id: str, project_path: str | None) -> str | None:
        return project_path

    async def plan(self, request: PlanRequest) -> Plan:
        self.asked.append(("plan", request))
        return Plan(project_path=None, inputs=None, claimed_path=WORKSPACE, shares_claimed_path=False)

    async def planned_path(self, request: PlanRequest) -> str | None:
        return WORKSPACE

    async def create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        self.asked.append(("create", (request.environment_id, request.attempt, request.path_key)))
        return Created(path=WORKSPACE, owns_path=True)

    async def remove(self, request: RemoveRequest, cancelled: threading.Event) -> RemoveResult:
        self.asked.append(("remove", (request.environment_id, request.attempt, request.path)))
        return Removed()

    async def idle_pause_due(self, host_id: str, provider_id: str, last_activity: datetime, now: datetime) -> bool:
        return False

    async def pause(
        self, request: ResourceRequest, checkpoint: Callable[[dict[str, Any]], Coroutine[Any, Any, object]]
    ) -> PauseResult:
        return PauseFailed("never asked")

    async def resume(self, request: ResourceRequest) -> ResumeResult:
        return ResumeFailed("never asked")

    async def survey(self, request: SurveyRequest) -> Survey:
        return Survey(found=[], absent=[])

    async def remove_leftover(self, request: LeftoverRemoval) -> RemoveResult:
        return RemoveFailed("never asked")


class FarHooks:
    def __init__(self) -> None:
        self.ran: list[tuple[HookKind, str]] = []

    async def run_hook(
        self,
        host_id: str,
        environment_id: str,
        operation_id: str,
        kind: HookKind,
        workspace: str,
        known: RecordedHook | None = None,
    ) -> HookOutcome:
        self.ran.append((kind, workspace))
        return HookOutcome("succeeded", 0)

    async def cancel_hook(self, host_id: str, operation_id: str) -> str:
        return "never-started"


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.01)


async def test_an_environment_lives_and_is_removed_through_a_host_the_core_only_asks():
    app = Environments(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, grace_for=lambda _: 0)
    store = Store(app)
    host, hooks, transcript = FarHost(), FarHooks(), Lines()
    hosts = OneMachine(host, hooks)
    placer = Placer(hosts)
    provisioner = Provisioner(store, placer, hosts, transcript)
    threads = ThreadHandlers(store, placer, hosts)
    try:
        environment = await threads.spawn(
            RegisterThread(thread_id="t1", host_id="local", environment=NewEnvironment("far", "local", None)), None
        )
        await provisioner.drive(environment.id, environment)
        await until(lambda: app.environment(environment.id).status == "ready", "ready")
        assert app.environment(environment.id).path == WORKSPACE

        archived = await store.run(app.archive_thread, "t1", datetime.now(UTC))
        assert archived is not None
        await provisioner.drive(environment.id, archived)
        await until(lambda: app.environment(environment.id).status == "removed", "removed")
    finally:
        await provisioner.stop()
        store.close()

    key = str(environment.id)
    assert host.asked == [
        ("plan", PlanRequest("local", "far", None, None, "t1")),
        ("create", (key, 1, "t1")),
        ("remove", (key, 1, WORKSPACE)),
    ]
    assert hooks.ran == [("setup", WORKSPACE), ("teardown", WORKSPACE)]
    assert (key, "step", "core", "Preparing Far away (attempt 1)") in transcript.lines
    assert not Path(WORKSPACE).exists()
