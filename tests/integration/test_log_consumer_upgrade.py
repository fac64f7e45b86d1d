"""An earlier service read the log with two consumers, `projections` and `provisioner`; this one
reads it once, with `projections` feeding the read model and then the provisioner. The
provisioner's old consumer is deleted at start, and what it still owed (an environment stopped
half way by a crash) is driven on all the same, once, by the start's sweep."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js import api
from nats.js.errors import NotFoundError

from bb_environments.bus.wire import subjects
from tests.integration.conftest import Service, eventually, service_environment, stream_log


async def test_the_provisioners_old_consumer_is_retired_and_what_it_owed_is_driven_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir, BB_CRASH_AT="created-recorded"))
    await service.start()
    nc = None
    try:
        # The creation is quick enough that the crash may come before the spawn's answer: not waited for.
        await service.bb(
            "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1", "--json"
        )
        await eventually(lambda: service.process.poll() is not None, "the crash once Created is recorded", 90)

        # As the earlier service left it: its own consumer of the environments' events, nothing acknowledged.
        nc = await service.connect("service")
        js = nc.jetstream()
        await js.add_consumer(
            subjects.ENVIRONMENTS_STREAM,
            api.ConsumerConfig(
                durable_name="provisioner",
                filter_subject=subjects.LOG_ENVIRONMENT_EVENTS,
                ack_policy=api.AckPolicy.EXPLICIT,
                deliver_policy=api.DeliverPolicy.ALL,
                ack_wait=30,
                max_ack_pending=1000,
            ),
        )

        service.environment = service_environment(data_dir)
        await service.start()
        environment_id = (await service.wait_for_thread("t1", having="environmentId"))["environmentId"]
        shown = await service.wait_for(environment_id, "ready")
        assert shown["status"] == "ready"
        with pytest.raises(NotFoundError):
            await js.consumer_info(subjects.ENVIRONMENTS_STREAM, "provisioner")
        # Read back as a replaying operator would, message by message. `show` answers from the
        # store an environment the read model never got before the crash, so `ready` may be shown
        # before the relay has published it: wait for the stream to hold it.
        steps = subjects.log_event("environment", environment_id, "")
        deadline = asyncio.get_running_loop().time() + 60
        while "ready" not in (
            kinds := [
                subject.removeprefix(steps) for _, subject, _ in await stream_log(js) if subject.startswith(steps)
            ]
        ):
            assert asyncio.get_running_loop().time() < deadline, f"the stream never held ready: {kinds}"
            await asyncio.sleep(0.1)
        assert len(kinds) == len(set(kinds)), kinds  # each step of the environment once
        assert "created" in kinds, kinds
    finally:
        if nc is not None:
            await nc.close()
        await service.stop()
