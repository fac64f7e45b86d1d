"""Replicas starting as a compose file or a service manager starts them (SPEC 7.2, v4): at the
same moment as the nodes of a cluster that is still forming, all of them wait for it and serve;
and a cluster without room for the streams is refused in one sentence."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from bb_environments.bus.wire.api_messages import ListThreads
from scripts.engines import NODES, NatsCluster, PostgresServer
from tests.integration.conftest import Service, eventually, service_environment

REPLICAS = ("a", "b", "c")
WAITING = "waiting for the NATS cluster"


def replica(cluster: NatsCluster, store: str, base: Path, replica_id: str, **overrides: str) -> Service:
    data_dir = base / replica_id / "data"
    data_dir.parent.mkdir(parents=True)
    service = Service(
        data_dir,
        service_environment(
            data_dir,
            BB_NATS_URL=cluster.urls,
            BB_NATS_NKEY=str(cluster.seed_file("service")),
            BB_EVENT_STORE=store,
            BB_STREAM_REPLICAS="3",
            BB_REPLICA_ID=replica_id,
            **overrides,
        ),
    )
    service.external_credentials = {"nkeys_seed": str(cluster.seed_file("operator"))}
    return service


async def test_replicas_started_with_the_nodes_of_a_new_cluster_all_wait_for_it_and_serve(
    tmp_path: Path, postgres_server: PostgresServer, postgres_url: str
) -> None:
    cluster = NatsCluster.prepare(tmp_path / "nats")
    replicas = [replica(cluster, postgres_url, tmp_path, r) for r in REPLICAS]
    first, *others = NODES
    try:
        cluster.start_node(first)  # one node of three: no meta leader, no stream can be placed
        starting = asyncio.gather(*(service.start("--no-agent") for service in replicas))
        for service in replicas:
            await eventually(lambda: WAITING in service.log_tail(), f"replica {service.data_dir} saying it waits")
        for node in others:
            cluster.start_node(node)
        await starting

        # Each takes its share of the work, and answers.
        for service in replicas:
            await eventually(lambda: "drives partitions" in service.log_tail(), f"replica {service.data_dir} driving")
        for service in replicas:
            assert service.api is not None
            assert (await service.api.call("threads", "list", ListThreads()))["threads"] == []
            assert service.process is not None and service.process.poll() is None, service.log_tail()
            said = (service.data_dir.parent / "serve.log").read_text()
            assert said.count(WAITING) == 1, said
    finally:
        for service in replicas:
            with contextlib.suppress(Exception):
                await service.stop()
        cluster.stop()


async def test_a_cluster_without_room_for_the_streams_is_refused_in_one_sentence(
    tmp_path: Path, postgres_url: str
) -> None:
    cluster = NatsCluster.prepare(tmp_path / "nats", max_file_store=512 << 20)  # BB_THREADS reserves 1 GiB
    service = replica(cluster, postgres_url, tmp_path, "a")
    try:
        for node in NODES:
            cluster.start_node(node)
        cluster.wait_healthy()
        refused = await service.bb("serve", "--no-agent", timeout=60)
    finally:
        cluster.stop()

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip().splitlines()[-1:] == [
        "bb: the NATS servers have no room for stream BB_THREADS: it reserves 1 GiB (BB_THREADS_MAX_BYTES) on each "
        "server that holds it, as does its mirror BB_THREAD_PARTITIONS, so give each server a max_file_store above "
        "2 GiB or lower BB_THREADS_MAX_BYTES"
    ]
