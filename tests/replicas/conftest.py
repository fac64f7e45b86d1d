"""The engines replicas share, real and on loopback: one PostgreSQL server for the session (a new
database for each test that asks) and one 3-node NATS cluster for each module that asks.

Both start in about a second; each is torn down however its tests ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.js import JetStreamContext

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.thread_events import InboundThreadEvent
from scripts.engines import NatsCluster, PostgresServer
from tests.support.os_users import unprivileged_user


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """As root (CI), the server runs as a user of its own, in a directory outside pytest's 0700 tmp dirs."""
    with contextlib.ExitStack() as stack:
        owner = stack.enter_context(unprivileged_user(f"bbpg{os.getpid()}")) if os.geteuid() == 0 else None
        base = Path(tempfile.mkdtemp(prefix="bb-postgres-"))
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        server = PostgresServer.start(base, owner)
        stack.callback(server.stop)
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new empty database of the session's server."""
    return postgres_server.create_database(f"test_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = NatsCluster.start(tmp_path_factory.mktemp("nats-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


async def publish_stored(js: JetStreamContext, event: InboundThreadEvent, timeout: float) -> None:
    """Publish a thread event as a publishing service does, sent again until the stream acknowledges
    it (a node gone, an election): its message id makes the stream drop a repeat."""
    kind = event.__struct_config__.tag
    assert isinstance(kind, str)
    deadline = time.monotonic() + timeout
    while True:
        try:
            await js.publish(
                subjects.thread_event(event.thread_id, kind),
                msgspec.json.encode(event),
                headers={"Nats-Msg-Id": f"{event.thread_id}:{kind}"},
            )
            return
        except (TimeoutError, nats.errors.Error):
            assert time.monotonic() < deadline, f"the thread stream took no {kind} of {event.thread_id} in {timeout} s"
            await asyncio.sleep(0.2)
