"""The in-process Workspaces port: what the core gets back when it asks this machine's providers."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from bb_environments.domain.request_errors import InvalidInput
from bb_environments.handlers.commands import NewEnvironment
from bb_environments.handlers.placement import Placer
from bb_environments.providers.contract import Created, CreateFailed, InvalidInputs, Previous, ProviderMissing, Removed
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspace_messages import CreateRequest, PlanRequest, RemoveRequest
from bb_environments.providers.workspaces import LocalWorkspaces
from tests.unit.one_machine import OneMachine
from tests.unit.test_random_interleavings import InstantProvider

ENVIRONMENT_ID = "0b6c1f5e-3d1a-4c53-9d0e-5b3f0c2a7e41"


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str, str]] = []

    def line(self, environment_id: str, kind: str, source: str, text: str, message_id: str | None = None) -> None:
        self.lines.append((environment_id, kind, source, text))


class Reporting(InstantProvider):
    """Creates its directory through whatever alias its data dir has, and says what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, Previous | None]] = []

    def create(self, ctx):
        self.asked.append((ctx.environment_id, ctx.attempt, ctx.previous))
        ctx.report.step("Making the directory")
        return super().create(ctx)


class Raising(InstantProvider):
    def create(self, ctx):
        raise OSError("disk on fire")


def create_request(attempt: int = 1, previous: Previous | None = None) -> CreateRequest:
    return CreateRequest(
        environment_id=ENVIRONMENT_ID,
        attempt=attempt,
        host_id="local",
        provider_id="instant",
        project_path=None,
        inputs=None,
        thread_id="t1",
        path_key="t1",
        previous=previous,
    )


async def test_a_create_answers_with_the_contract_s_created_for_the_environment_and_attempt_asked(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    provider, transcript = Reporting(), Lines()
    workspaces = LocalWorkspaces(ProviderRegistry([provider]), tmp_path / "alias", transcript)
    previous = Previous(1, None, None)

    answer = await workspaces.create(create_request(attempt=2, previous=previous), threading.Event())

    # The path as the host knows it, aliases resolved: the path the core records and claims.
    assert answer == Created(path=str(real / "providers" / "instant" / "ws" / "t1"), owns_path=True)
    assert provider.asked == [(ENVIRONMENT_ID, 2, previous)]
    assert transcript.lines == [(ENVIRONMENT_ID, "step", "instant", "Making the directory")]


async def test_a_provider_that_raises_fails_its_create_for_good_and_is_named(tmp_path):
    workspaces = LocalWorkspaces(ProviderRegistry([Raising()]), tmp_path, Lines())

    answer = await workspaces.create(create_request(), threading.Event())

    assert answer == CreateFailed("terminal", "the 'instant' provider failed: disk on fire")


async def test_removing_with_a_provider_that_is_not_registered_waits_for_it(tmp_path):
    workspaces = LocalWorkspaces(ProviderRegistry([InstantProvider()]), tmp_path, Lines())
    request = RemoveRequest(
        environment_id=ENVIRONMENT_ID,
        attempt=1,
        host_id="local",
        provider_id="uninstalled",
        project_path=None,
        inputs=None,
        path=None,
        path_key="t1",
        resource=None,
    )

    with pytest.raises(ProviderMissing, match="^the environment provider 'uninstalled' is not registered$"):
        await workspaces.remove(request, threading.Event())


def remove_request(attempt: int = 1, removal_attempt: int = 1) -> RemoveRequest:
    return RemoveRequest(
        environment_id=ENVIRONMENT_ID,
        attempt=attempt,
        host_id="local",
        provider_id="instant",
        project_path=None,
        inputs=None,
        path=None,
        path_key="t1",
        resource=None,
        removal_attempt=removal_attempt,
    )


class Held(InstantProvider):
    """Its create begins, then waits to be let go before it makes its directory."""

    def __init__(self) -> None:
        self.making = threading.Event()
        self.let_go = threading.Event()

    def create(self, ctx):
        self.making.set()
        self.let_go.wait(30)
        return super().create(ctx)


async def test_a_removal_asked_while_a_create_runs_waits_for_it_and_removes_what_it_made(tmp_path):
    provider = Held()
    workspaces = LocalWorkspaces(ProviderRegistry([provider]), tmp_path, Lines())
    creating = asyncio.create_task(workspaces.create(create_request(), threading.Event()))
    await asyncio.to_thread(provider.making.wait, 30)
    removing = asyncio.create_task(workspaces.remove(remove_request(), threading.Event()))
    await asyncio.sleep(0.2)  # a removal that did not wait would have ended by now, before the create made anything
    assert not removing.done()

    provider.let_go.set()
    created = await creating
    assert isinstance(created, Created)
    assert await removing == Removed()
    assert not Path(created.path).exists()


async def test_a_create_of_an_attempt_whose_removal_began_is_refused_and_makes_nothing(tmp_path):
    workspaces = LocalWorkspaces(ProviderRegistry([InstantProvider()]), tmp_path, Lines())
    assert await workspaces.remove(remove_request(attempt=1, removal_attempt=0), threading.Event()) == Removed()

    late = await workspaces.create(create_request(attempt=1), threading.Event())

    assert late == CreateFailed(
        "terminal",
        f"attempt 1 of environment {ENVIRONMENT_ID} was removed on this host; its workspace is not made again",
    )
    assert not (tmp_path / "providers" / "instant" / "ws" / "t1").exists()
    # A cleanup ends its attempt and those before it; the environment's removal ends every one.
    assert isinstance(await workspaces.create(create_request(attempt=2), threading.Event()), Created)
    assert await workspaces.remove(remove_request(attempt=2, removal_attempt=1), threading.Event()) == Removed()
    assert isinstance(await workspaces.create(create_request(attempt=3), threading.Event()), CreateFailed)
    assert not (tmp_path / "providers" / "instant" / "ws" / "t1").exists()


async def test_a_project_inside_the_data_dir_is_refused_with_the_reason(tmp_path):
    data_dir = Path(os.path.realpath(tmp_path)) / "data"
    project = data_dir / "providers"
    project.mkdir(parents=True)
    workspaces = LocalWorkspaces(ProviderRegistry([InstantProvider()]), data_dir, Lines())
    reason = (
        f"project path {str(project)!r} is inside bb's data dir {str(data_dir)!r}, which holds bb's own state "
        "and workspaces; pass a project directory outside it"
    )

    with pytest.raises(InvalidInputs) as refused:
        await workspaces.plan(PlanRequest("local", "instant", str(project), None, "t1"))
    assert str(refused.value) == reason
    # The core's placement answers the request with the same words.
    with pytest.raises(InvalidInput) as answered:
        await Placer(OneMachine(workspaces)).place(
            "t1", NewEnvironment("instant", "local", None), str(project), "local"
        )
    assert str(answered.value) == reason


class Containing:
    """Notes whose hooks a removal ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def prepare(self, environment_id: str) -> list[str]:
        return []

    def end(self, environment_id: str) -> bool:
        self.ended.append(environment_id)
        return True


async def test_a_cleanup_that_comes_after_the_next_attempt_began_ends_no_hook_and_removes_nothing(tmp_path):
    containment = Containing()
    workspaces = LocalWorkspaces(ProviderRegistry([InstantProvider()]), tmp_path, Lines(), containment=containment)
    assert isinstance(await workspaces.create(create_request(attempt=1), threading.Event()), Created)
    assert await workspaces.remove(remove_request(attempt=1, removal_attempt=0), threading.Event()) == Removed()
    assert containment.ended == [ENVIRONMENT_ID]
    second = await workspaces.create(create_request(attempt=2), threading.Event())
    assert isinstance(second, Created)

    # The same cleanup again, from a replica that froze while it asked, or delivered twice.
    late = await workspaces.remove(remove_request(attempt=1, removal_attempt=0), threading.Event())

    assert late == Removed()
    assert containment.ended == [ENVIRONMENT_ID]  # the second attempt's setup runs on
    assert Path(second.path).exists()
    # The environment's own removal still ends everything.
    assert await workspaces.remove(remove_request(attempt=2, removal_attempt=1), threading.Event()) == Removed()
    assert containment.ended == [ENVIRONMENT_ID, ENVIRONMENT_ID] and not Path(second.path).exists()
