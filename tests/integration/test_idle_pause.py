"""Idle environments of a provider that can suspend them are paused, and resumed on activity."""

from __future__ import annotations

from pathlib import Path

import msgspec

from bb_environments.bus.wire import subjects
from tests.integration.conftest import Service, environment_events, service_environment
from tests.integration.test_crash_recovery import died, ran
from tests.support.gated_provider import calls

PAUSABLE = "tests.support.gated_provider:PausableProvider"


def pausable_service(tmp_path: Path, **overrides: str) -> Service:
    return Service(
        tmp_path / "data",
        service_environment(tmp_path / "data", BB_EXTRA_PROVIDERS=PAUSABLE, BB_SWEEP_INTERVAL_S="0.2", **overrides),
    )


async def paused_environment(service: Service, project: Path) -> str:
    """The environment of thread t1, once its provider paused it for being idle."""
    for gate in ("create", "remove"):
        (provider_dir(service) / "gates").mkdir(parents=True, exist_ok=True)
        (provider_dir(service) / "gates" / gate).touch()
    environment_id = await service.spawn("pausable", project=project, thread_id="t1")
    paused = await service.wait_for(environment_id, lambda e: e["pausedAt"] is not None)
    assert paused["status"] == "ready"
    assert "pause 1" in calls(provider_dir(service))
    assert not any(c.startswith("resume") for c in calls(provider_dir(service)))  # no activity yet
    return environment_id


def provider_dir(service: Service) -> Path:
    return service.data_dir / "providers" / "pausable"


async def send_message(service: Service, thread_id: str) -> None:
    publisher = await service.connect("publisher")
    try:
        message = {"type": "message", "occurredAt": "2026-11-30T12:00:00Z", "threadId": thread_id}
        await publisher.jetstream().publish(subjects.thread_event(thread_id, "message"), msgspec.json.encode(message))
    finally:
        await publisher.close()


async def test_an_idle_environment_is_paused_and_a_message_resumes_it_without_setup(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "markers").mkdir()
    (project / ".bb-env-setup.sh").write_text(f"echo setup >> {tmp_path}/markers/setup\n")
    service = pausable_service(tmp_path)
    await service.start()
    try:
        environment_id = await paused_environment(service, project)

        await send_message(service, "t1")
        await service.wait_for(environment_id, lambda e: "resume from 1" in calls(provider_dir(service)))
        assert ran(tmp_path, "setup") == 1

        await service.bb("thread", "archive", "t1")
        await service.wait_for(environment_id, "removed")
    finally:
        await service.stop()


async def test_a_service_killed_as_it_resumed_resumes_the_environment_once_it_is_back(tmp_path):
    """The message asked for the resume in the log: the service started again acts on it, though
    the message was handled and no thread says anything more."""
    project = tmp_path / "project"
    project.mkdir()
    service = pausable_service(tmp_path, BB_CRASH_AT="resume-returned")
    await service.start()
    try:
        environment_id = await paused_environment(service, project)

        await send_message(service, "t1")
        await died(service)
        service.environment = service.environment | {"BB_CRASH_AT": ""}
        await service.start()
        await service.wait_for(
            environment_id, lambda e: e["pausedAt"] is None or "pause 2" in calls(provider_dir(service))
        )

        types = [e["type"] for e in await environment_events(service, environment_id)]
        assert types.count("resume_requested") == 1 and types.count("resumed") >= 1
        assert calls(provider_dir(service)).count("resume from 1") == 2  # the one the kill cut short, then again
    finally:
        await service.stop()
