"""The host agent's heartbeat: what it says of itself every few seconds into bucket BB_HOSTS, under
its host id, for `bb machine list` and for the core's waiting steps (bus/core/job_queue.py)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

import msgspec
from nats.aio.client import Client

from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import HostHeartbeat

HEARTBEAT_S = 5.0
"""A third of the time after which an agent is offline, so one lost beat changes nothing."""


async def beat(nc: Client, host_id: str, root: str, version: str, health: BusHealth) -> None:
    js = nc.jetstream()
    subject = f"$KV.{subjects.HOSTS_BUCKET}.{host_id}"
    while True:
        heartbeat = HostHeartbeat(
            host_id=host_id, seen_at=datetime.now(UTC), root=root, pid=os.getpid(), version=version
        )
        try:
            await js.publish(subject, msgspec.json.encode(heartbeat))
        except BUS_UNAVAILABLE as error:
            health.noticed(f"the heartbeat of host {host_id!r}", error)
        await asyncio.sleep(HEARTBEAT_S)
