"""The host agent acts only on what the log recorded, whoever reaches its subjects.

The service runs on a nats-server without authentication: every request here gets past the
permissions (as a client with too many rights, or one the deployment misconfigured, would), so
what these tests see is the agent's own check.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC
from pathlib import Path

import nats.aio.client
import pytest

from bb_environments.bus.embedded_server import EmbeddedNats
from bb_environments.bus.wire import subjects
from tests.integration.conftest import Service, service_environment, spawn_with_setup_held


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    server = EmbeddedNats.start(tmp_path / "plain-nats")
    running = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_NATS_URL=server.url))
    try:
        await running.start()
        yield running
    finally:
        await running.stop()
        server.stop()


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A directory whose setup script would leave a file behind if anything ran it."""
    directory = tmp_path / "planted"
    directory.mkdir()
    (directory / ".bb-env-setup.sh").write_text(f"touch {tmp_path / 'pwned'}\n")
    return directory


async def ask(nc: nats.aio.client.Client, verb: str, body: dict | bytes) -> tuple[str | None, bytes]:
    """The agent's error code (None for an answer) and its reply."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = await nc.request(subjects.host_hooks("local", verb), data, timeout=10)
    return (reply.headers or {}).get("Nats-Service-Error-Code"), reply.data


def service_log(service: Service) -> str:
    return (service.data_dir.parent / "serve.log").read_text()


async def test_an_operation_the_log_never_recorded_is_refused_and_logged(service, planted, tmp_path):
    nc = await service.connect("operator")
    try:
        start = {
            "operationId": "forged.1",
            "kind": "setup",
            "workspace": str(planted),
            "environmentId": str(uuid.uuid4()),
        }
        assert (await ask(nc, "start", start))[0] == "refused"
        assert (await ask(nc, "status", {"operationId": "forged.1"}))[0] == "refused"
        assert (await ask(nc, "cancel", {"operationId": "forged.1"}))[0] == "refused"
        assert (await ask(nc, "start", b"{not json"))[0] == "refused"
    finally:
        await nc.close()

    await asyncio.sleep(0.5)  # time enough for a script that was started to have run
    assert not (tmp_path / "pwned").exists()
    log = service_log(service)
    for verb in ("start", "status", "cancel"):
        assert f"refused bb.hosts.local.hooks.{verb} for operation 'forged.1': the log recorded no such" in log
    assert "refused bb.hosts.local.hooks.start for operation None: malformed request" in log
    assert "Traceback" not in log


async def test_a_recorded_operation_runs_only_where_recorded_and_is_stopped_only_when_the_log_says(
    service, git_repo, planted, tmp_path
):
    hold, marker = tmp_path / "hold-setup", tmp_path / "hooks.log"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, marker)
    shown = await service.wait_for(environment_id, lambda e: e["hooks"]["setup"]["status"] == "running")
    operation, workspace = shown["hooks"]["setup"]["operationId"], shown["path"]
    recorded = {"operationId": operation, "kind": "setup", "workspace": workspace, "environmentId": environment_id}

    nc = await service.connect("operator")
    try:
        for forged in ({"workspace": str(planted)}, {"kind": "teardown"}, {"environmentId": str(uuid.uuid4())}):
            assert (await ask(nc, "start", {**recorded, **forged}))[0] == "refused", forged
        assert (await ask(nc, "cancel", {"operationId": "forged.1"}))[0] == "refused"
        assert (await ask(nc, "cancel", {"operationId": operation}))[0] == "refused"  # the log still waits for it

        status, answer = await ask(nc, "status", {"operationId": operation})
        assert status is None and json.loads(answer)["state"] == "running"
        status, answer = await ask(nc, "start", recorded)  # exactly as recorded: joins the running hook
        assert status is None and json.loads(answer)["state"] == "running"
    finally:
        await nc.close()

    hold.unlink()
    ready = await service.wait_for(environment_id, "ready")
    assert ready["hooks"]["setup"] == {"status": "succeeded", "operationId": operation}
    assert marker.read_text().split() == ["setup"]
    assert not (tmp_path / "pwned").exists()
    log = service_log(service)
    assert f"refused bb.hosts.local.hooks.start for operation {operation!r}: the log recorded the setup hook" in log
    assert f"refused bb.hosts.local.hooks.cancel for operation {operation!r}: its environment still waits" in log
    assert "Traceback" not in log


async def test_the_core_takes_a_hooks_outcome_only_as_its_agent_reported_it(tmp_path):
    """A client's push consumer can deliver a stored message onto the subject where the core waits
    for a remote host's report; the copy keeps its stored subject and is not taken for one."""
    from datetime import datetime

    import msgspec
    from nats.js import api

    from bb_environments.bus.core.job_queue import HostJobQueue, HostLiveness
    from bb_environments.bus.core.remote_host import RemoteHost
    from bb_environments.bus.streams import ensure_hosts, ensure_streams
    from bb_environments.bus.wire.host_protocol import HookJob, HookReport, HostHeartbeat
    from bb_environments.domain.hook_operations import HookOutcome

    server = EmbeddedNats.start(tmp_path / "plain-nats")
    core, agent = await nats.connect(server.url), await nats.connect(server.url)
    try:
        js = agent.jetstream()
        await ensure_streams(js, 3600, 1 << 20)
        await ensure_hosts(js, ["remote"])
        heartbeat = HostHeartbeat(
            host_id="remote", seen_at=datetime.now(UTC), root=str(tmp_path), pid=1, version="test"
        )
        await js.publish("$KV.BB_HOSTS.remote", msgspec.json.encode(heartbeat))
        await js.add_stream(api.StreamConfig(name="STORED", subjects=["stored.>"]))
        forged = HookReport("op.1", HookOutcome("succeeded", 0))
        await js.publish("stored.forged", msgspec.json.encode(forged))
        report_subject = subjects.host_report("remote", "op.1")

        async def take_the_job() -> None:
            jobs = await js.pull_subscribe_bind(
                durable=subjects.host_jobs_consumer("remote"), stream=subjects.HOST_JOBS_STREAM
            )
            job = (await jobs.fetch(1, timeout=20))[0]
            assert msgspec.json.decode(job.data, type=HookJob).operation_id == "op.1"
            # Stored copies pushed onto the subject the core listens on, then the agent's own word.
            await js.add_consumer(
                "STORED",
                api.ConsumerConfig(name="pusher", deliver_subject=report_subject, ack_policy=api.AckPolicy.NONE),
            )
            # The copy is on its way to the core first; the outcome below must still be the one taken.
            deadline = asyncio.get_running_loop().time() + 10
            while (await js.consumer_info("STORED", "pusher")).delivered.consumer_seq < 1:
                assert asyncio.get_running_loop().time() < deadline, "the stored copy was never pushed"
                await asyncio.sleep(0.02)
            genuine = HookReport("op.1", HookOutcome("failed", 3))
            await js.publish(report_subject, msgspec.json.encode(genuine))
            await job.ack()

        taking = asyncio.create_task(take_the_job())
        client = RemoteHost(core, HostJobQueue(core, core.jetstream(), HostLiveness(core.jetstream())))
        outcome = await asyncio.wait_for(
            client.run_hook("remote", str(uuid.uuid4()), "op.1", "setup", str(tmp_path)), 30
        )
        await taking
        assert outcome == HookOutcome("failed", 3)
        assert (await js.consumer_info("STORED", "pusher")).delivered.consumer_seq == 1
    finally:
        await core.close()
        await agent.close()
        server.stop()
