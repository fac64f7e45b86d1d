"""Failed creates are cleaned before any retry; transient ones retry by themselves, a few times."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.conftest import Service, service_environment
from tests.integration.test_crash_recovery import GATED, open_gates, provider_dir
from tests.support.gated_provider import calls

FLAKY = "tests.support.gated_provider:FlakyProvider"


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    """A service with the gated and flaky test providers and transient retries after 50 ms."""
    running = Service(
        tmp_path / "data",
        service_environment(tmp_path / "data", BB_EXTRA_PROVIDERS=f"{GATED},{FLAKY}", BB_TRANSIENT_RETRY_S="0.05"),
    )
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def plan_failures(service: Service, kind: str, count: int) -> Path:
    directory = service.data_dir / "providers" / "flaky"
    (directory / "gates").mkdir(parents=True, exist_ok=True)
    (directory / "gates" / "create").touch()
    (directory / "gates" / "remove").touch()
    (directory / "failures").write_text(f"{kind} {count}")
    return directory


async def spawn_flaky(service: Service, tmp_path: Path, thread_id: str = "t1") -> dict:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    result = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "flaky",
        "--project",
        str(project),
        "--thread-id",
        thread_id,
        "--json",
    )
    assert result.returncode == 0, result.stderr
    return result.json()


async def test_transient_failures_are_cleaned_then_retried_until_ready(service, tmp_path):
    directory = plan_failures(service, "transient", 2)
    environment_id = (await spawn_flaky(service, tmp_path))["environmentId"]
    ready = await service.wait_for(environment_id, "ready")
    assert ready["attempt"] == 3 and ready["pathKey"] == "t1-3"
    assert calls(directory) == [
        "create t1-1 1 failed",
        "remove t1-1 1 None",
        "create t1-2 2 failed",
        "remove t1-2 2 None",
        "create t1-3 3",
    ]
    assert sorted(p.name for p in (directory / "workspaces").iterdir()) == ["t1-3"]


async def test_transient_retries_stop_after_the_limit(service, tmp_path):
    directory = plan_failures(service, "transient", 10)
    environment_id = (await spawn_flaky(service, tmp_path))["environmentId"]
    failed = await service.wait_for(
        environment_id,
        lambda e: e["status"] == "error" and e["attempt"] == 4 and "remove t1-4 4 None" in calls(directory),
    )
    assert "transient failure" in failed["statusMessage"]
    assert [c for c in calls(directory) if c.startswith("create")] == [
        f"create t1-{n} {n} failed" for n in (1, 2, 3, 4)
    ]


async def test_a_terminal_failure_waits_for_an_explicit_retry_on_the_same_environment(service, tmp_path):
    directory = plan_failures(service, "terminal", 1)
    spawned = await spawn_flaky(service, tmp_path)
    failed = await service.wait_for(spawned["environmentId"], lambda e: e["status"] == "error")
    assert failed["statusMessage"] == "terminal failure, 1 left"
    await service.wait_for(spawned["environmentId"], lambda e: "remove t1-1 1 None" in calls(directory))
    retried = await service.bb("environment", "retry", spawned["environmentId"], "--json")
    assert retried.returncode == 0, retried.stderr
    ready = await service.wait_for(spawned["environmentId"], "ready")
    assert ready["attempt"] == 2 and ready["id"] == spawned["environmentId"]


async def test_pending_cleanup_survives_a_restart_without_its_provider(service, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "gated", "--project", str(project), "--thread-id", "t1", "--json"
    )
    environment_id = spawned.json()["environmentId"]
    await service.stop()

    service.environment = service_environment(service.data_dir)  # the provider is gone
    await service.start()
    failed = await service.wait_for(environment_id, "error")
    assert "not registered" in failed["statusMessage"]
    await service.bb("thread", "archive", "t1")
    stuck = await service.wait_for(environment_id, "removing")
    assert stuck["claimedPath"]
    await service.stop()

    service.environment = service_environment(service.data_dir, BB_EXTRA_PROVIDERS=GATED)
    await service.start()
    await open_gates(service, "remove")
    await service.wait_for(environment_id, "removed")
    assert [c.split()[0] for c in calls(provider_dir(service))] == ["create", "remove"]
