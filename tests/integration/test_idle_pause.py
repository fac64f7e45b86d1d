"""Idle environments of a provider that can suspend them are paused, and resumed on activity."""

from __future__ import annotations

import msgspec

from bb_environments.bus.wire import subjects
from tests.integration.conftest import Service, service_environment
from tests.integration.test_crash_recovery import ran
from tests.support.gated_provider import calls

PAUSABLE = "tests.support.gated_provider:PausableProvider"


async def test_an_idle_environment_is_paused_and_a_message_resumes_it_without_setup(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "markers").mkdir()
    (project / ".bb-env-setup.sh").write_text(f"echo setup >> {tmp_path}/markers/setup\n")
    service = Service(
        tmp_path / "data",
        service_environment(tmp_path / "data", BB_EXTRA_PROVIDERS=PAUSABLE, BB_SWEEP_INTERVAL_S="0.2"),
    )
    await service.start()
    publisher = await service.connect("publisher")
    try:
        directory = service.data_dir / "providers" / "pausable"
        for gate in ("create", "remove"):
            (directory / "gates").mkdir(parents=True, exist_ok=True)
            (directory / "gates" / gate).touch()
        spawned = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "pausable",
            "--project",
            str(project),
            "--thread-id",
            "t1",
            "--json",
        )
        environment_id = spawned.json()["environmentId"]
        paused = await service.wait_for(environment_id, lambda e: e["pausedAt"] is not None)
        assert paused["status"] == "ready"
        assert "pause 1" in calls(directory)
        assert not any(c.startswith("resume") for c in calls(directory))  # no activity yet

        message = {"type": "message", "occurredAt": "2026-11-30T12:00:00Z", "threadId": "t1"}
        await publisher.jetstream().publish(subjects.thread_event("t1", "message"), msgspec.json.encode(message))
        await service.wait_for(environment_id, lambda e: "resume from 1" in calls(directory))
        assert ran(tmp_path, "setup") == 1

        await service.bb("thread", "archive", "t1")
        await service.wait_for(environment_id, "removed")
    finally:
        await publisher.close()
        await service.stop()
