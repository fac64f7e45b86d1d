"""The provisioner starts each long step once for the state that asks for it: not again at once
when it failed without recording anything, and not again from an environment a drive was handed
before the step's outcome was saved."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bb_environments.handlers.application import Environments
from bb_environments.handlers.commands import NewEnvironment, RegisterThread
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.provisioning import FAILED_STEP_RETRY, Provisioner
from bb_environments.handlers.store import Store
from bb_environments.handlers.threads import ThreadHandlers
from bb_environments.providers.contract import Created, CreateFailed, RemoveFailed
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspaces import LocalWorkspaces
from tests.unit.one_machine import OneMachine
from tests.unit.test_random_interleavings import HostWithoutScripts, InstantProvider, Silent


class Running:
    def __init__(self, provider: InstantProvider, root: Path, failed_step_retry: timedelta = FAILED_STEP_RETRY) -> None:
        self.app = Environments(
            env={
                "PERSISTENCE_MODULE": "eventsourcing.popo",
                "AGGREGATE_CACHE_MAXSIZE": "100",
                "AGGREGATE_CACHE_FASTFORWARD": "n",
            },
            grace_for=lambda _: 0,
        )
        self.store = Store(self.app)
        self.provider = provider
        workspaces = LocalWorkspaces(ProviderRegistry([provider]), root, Silent())
        self.hooks = HostWithoutScripts()
        hosts = OneMachine(workspaces, self.hooks)
        placer = Placer(hosts)
        self.provisioner = Provisioner(self.store, placer, hosts, Silent(), failed_step_retry=failed_step_retry)
        self.threads = ThreadHandlers(self.store, placer, hosts)

    async def spawn(self, thread_id: str):
        return await self.threads.spawn(
            RegisterThread(thread_id=thread_id, host_id="local", environment=NewEnvironment("instant", "local", None)),
            None,
        )

    async def driven(self, thread_id: str, until: threading.Event, *, hand_over: bool = False):
        """A spawned environment, driven until the provider sets `until`; `hand_over`: the drive is
        given the spawn's copy, as the spawn hands it, instead of reading the environment."""
        environment = await self.spawn(thread_id)
        await self.provisioner.drive(environment.id, environment if hand_over else None)
        assert await asyncio.to_thread(until.wait, 10), "the provider never got there"
        return environment

    async def settled(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.provisioner.busy:
            assert time.monotonic() < deadline, "a step never ended"
            await asyncio.sleep(0.01)


@pytest.fixture
async def running(request, tmp_path: Path) -> AsyncIterator[Running]:
    service = Running(request.param(), tmp_path)
    yield service
    await service.provisioner.stop()
    service.store.close()


class CleanupKeepsFailing(InstantProvider):
    def __init__(self) -> None:
        self.removes = 0
        self.removed_once = threading.Event()

    def create(self, ctx):
        return CreateFailed("terminal", "no such image")

    def remove(self, ctx):
        self.removes += 1
        self.removed_once.set()
        return RemoveFailed("the directory is busy")


@pytest.mark.parametrize("running", [CleanupKeepsFailing], indirect=True)
async def test_a_cleanup_that_failed_waits_before_it_runs_again(running):
    provider = running.provider
    environment = await running.driven("a", provider.removed_once)
    await running.settled()
    for _ in range(3):  # sweeps come round meanwhile
        await running.provisioner.sweep()
        await running.settled()

    assert provider.removes == 1
    assert running.app.environment(environment.id).status == "error"


async def test_a_cleanup_that_failed_runs_again_once_its_wait_is_over(tmp_path):
    running = Running(CleanupKeepsFailing(), tmp_path, failed_step_retry=timedelta(seconds=0.2))
    try:
        environment = await running.spawn("a")
        await running.provisioner.drive(environment.id)
        deadline = time.monotonic() + 10
        while running.provider.removes < 2:  # the wake-up after the wait drives it again, no sweep needed
            assert time.monotonic() < deadline, "a failed cleanup was never tried again"
            await asyncio.sleep(0.01)
    finally:
        await running.provisioner.stop()
        running.store.close()


class CreateHeld(InstantProvider):
    def __init__(self) -> None:
        self.creates: list[int] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def create(self, ctx):
        self.creates.append(ctx.attempt)
        self.entered.set()
        self.release.wait(10)
        return super().create(ctx)


@pytest.mark.parametrize("running", [CreateHeld], indirect=True)
async def test_a_drive_handed_an_environment_from_before_a_steps_outcome_does_not_start_it_again(running):
    provisioner, app, provider = running.provisioner, running.app, running.provider
    environment = await running.driven("a", provider.entered, hand_over=True)
    # As a drive (the sweep's, say) holds the environment: no public call holds it still.
    async with provisioner._locks[environment.id]:
        await running.store.run(app.register_thread, "b", None, None, "local", None)
        joined = await running.store.run(app.attach_thread, "b", environment.id)  # a spawn joins it, creating
        joining_drive = asyncio.create_task(provisioner.drive(environment.id, joined))
        provider.release.set()  # the create ends; its outcome is saved, and its drive waits for the lock
        await running.settled()
    await joining_drive
    await running.settled()

    assert provider.creates == [1]
    assert app.environment(environment.id).status == "ready"


class PausesHeld(InstantProvider):
    """A pausable provider whose pause, and whose second idle check, wait for the test."""

    def __init__(self) -> None:
        self.pauses: list[dict] = []
        self.resumes = 0
        self.pausing, self.pause_may_end = threading.Event(), threading.Event()
        self.checks = 0
        self.second_check, self.second_check_may_end = threading.Event(), threading.Event()

    def create(self, ctx):
        created = super().create(ctx)
        return Created(path=created.path, owns_path=True, resource={"sandbox": "sb-1"})

    def idle_pause_due(self, last_activity, now, data_dir) -> bool:
        self.checks += 1
        if self.checks == 2:
            self.second_check.set()
            self.second_check_may_end.wait(10)
        return True

    def pause(self, resource, checkpoint):
        self.pauses.append(resource)
        self.pausing.set()
        self.pause_may_end.wait(10)
        return {"snapshot": "im-1"}

    def resume(self, resource):
        self.resumes += 1
        return {"sandbox": "sb-2"}


@pytest.mark.parametrize("running", [PausesHeld], indirect=True)
async def test_an_idle_check_that_a_pause_overtook_does_not_pause_again(running):
    provisioner, app, provider = running.provisioner, running.app, running.provider
    # Once ready, a drive finds it idle and starts a pause, which waits.
    environment = await running.driven("a", provider.pausing)

    sweep = asyncio.create_task(provisioner.drive(environment.id))  # asks the provider again, meanwhile
    assert await asyncio.to_thread(provider.second_check.wait, 10)
    provider.pause_may_end.set()  # the pause ends and is recorded while that check runs
    deadline = time.monotonic() + 10
    while app.environment(environment.id).paused_at is None:
        assert time.monotonic() < deadline, "the pause was never recorded"
        await asyncio.sleep(0.01)
    provider.second_check_may_end.set()
    await sweep
    await running.settled()

    assert provider.pauses == [{"sandbox": "sb-1"}]


@pytest.mark.parametrize("running", [PausesHeld], indirect=True)
async def test_a_message_while_the_pause_runs_resumes_the_environment_once_it_is_paused(running):
    provisioner, provider = running.provisioner, running.provider
    provider.second_check_may_end.set()
    environment = await running.driven("a", provider.pausing)

    await provisioner.note_activity(environment)  # the thread's message, as the pause runs
    provider.pause_may_end.set()
    deadline = time.monotonic() + 10
    while provider.resumes == 0:
        assert time.monotonic() < deadline, "the message that came during the pause was never answered by a resume"
        await asyncio.sleep(0.01)


class CleanupFailsOnce(CleanupKeepsFailing):
    """A create that fails for good, whose cleanup fails: the environment stays in error with a
    failed step remembered, until its removal succeeds."""

    def remove(self, ctx):
        return super().remove(ctx) if self.removes == 0 else InstantProvider.remove(self, ctx)


@pytest.mark.parametrize("running", [CleanupFailsOnce], indirect=True)
async def test_a_removed_environment_leaves_no_marks_and_a_late_copy_of_it_starts_nothing(running):
    provisioner, app, provider = running.provisioner, running.app, running.provider
    environment = await running.driven("a", provider.removed_once, hand_over=True)
    await running.settled()
    assert [key for key in provisioner._failed_steps if key[0] == environment.id] == [(environment.id, "cleanup.1")]

    archived = await running.store.run(app.archive_thread, "a", datetime.now(UTC))
    assert archived is not None
    await provisioner.drive(environment.id, archived)
    deadline = time.monotonic() + 10
    while app.environment(environment.id).status != "removed":
        assert time.monotonic() < deadline, "the environment was never removed"
        await running.settled()
        await asyncio.sleep(0.01)
    await running.settled()

    # A service that runs for months keeps no mark of it (its lock and the version it advanced from aside).
    assert not [key for key in provisioner._failed_steps if key[0] == environment.id]
    assert environment.id not in provisioner._newest_known and environment.id not in provisioner._timers
    removes = provider.removes
    await provisioner.drive(environment.id, environment)  # the spawn's copy, handed over long after the removal
    await running.settled()
    assert provider.removes == removes and app.environment(environment.id).status == "removed"


class CountsCreates(InstantProvider):
    def __init__(self) -> None:
        self.creates = 0

    def create(self, ctx):
        self.creates += 1
        return super().create(ctx)


async def test_a_stopped_provisioner_starts_no_step_for_a_drive_that_comes_late(tmp_path):
    """A drive that outlives the stop (a timer's that had fired, an answer's still under way)
    would run a provider's create on a worker thread while the service goes down, or, in a process
    that goes on, after its stores are closed."""
    running = Running(CountsCreates(), tmp_path)
    try:
        environment = await running.spawn("a")
        await running.provisioner.stop()
        await running.provisioner.drive(environment.id)
        assert not running.provisioner.busy
        assert running.provider.creates == 0
        assert running.app.environment(environment.id).status == "creating"  # the next start's sweep creates it
    finally:
        running.store.close()
