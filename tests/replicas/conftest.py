"""The engines replicas share, real and on loopback: one PostgreSQL server for the session (a new
database for each test that asks) and one 3-node NATS cluster for each module that asks.

Both start in about a second; each is torn down however its tests ended.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
