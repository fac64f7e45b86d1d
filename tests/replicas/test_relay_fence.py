"""The relay's fence (SPEC 7.2; docs/architecture.md): the replica holding the relay lease stopped
or cut off past its lease while threads flow, then let go. The other replica relays meanwhile,
the woken one publishes nothing the stream stores or chokes on, and the stream goes on: spawns
made after it woke are ready. Before the fence was the stream's expected last sequence alone, a
woken relay made every node of a replicated stream log a critical write error, and the stream
stopped for good."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest

from scripts.engines import NODES
from tests.integration.conftest import eventually
from tests.replicas.test_replicas import (  # noqa: F401 (the fixture)
    SETTLE_S,
    Topology,
    assert_each_event_once_in_order,
    publish_thread,
    ready_in_the_stream,
    relay_holder,
    spawn,
    topology,
)

RATE = 8.0
"""Threads a second the flow publishes: about what a busy integrator sends."""


class ThreadFlow:
    """Threads published one after another, as an integrator's service sends them, until stopped."""

    def __init__(self, nc: nats.aio.client.Client) -> None:
        self._js = nc.jetstream()
        self.threads: list[str] = []

    async def run(self) -> None:
        while True:
            thread = f"t-{uuid.uuid4().hex[:16]}"
            await publish_thread(self._js, thread)
            self.threads.append(thread)
            await asyncio.sleep(1 / RATE)

    async def more(self, count: int) -> None:
        """Wait until `count` more threads were published."""
        wanted = len(self.threads) + count
        deadline = time.monotonic() + SETTLE_S
        while len(self.threads) < wanted:
            assert time.monotonic() < deadline, f"the flow published {len(self.threads)} threads, not {wanted}"
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def flowing(topology: Topology, nodes: list[str]) -> AsyncIterator[ThreadFlow]:
    nc = await nats.connect(
        topology.cluster.urls_of(nodes).split(","), nkeys_seed=str(topology.cluster.seed_file("publisher"))
    )
    flow = ThreadFlow(nc)
    task = asyncio.create_task(flow.run())
    try:
        yield flow
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()


async def until_relayed_by(topology: Topology, replica_id: str) -> None:
    async def holder() -> str | None:
        # Forgotten and not taken again yet; or asked through a node that is paused, or while the
        # bucket's leader moves off it: asked again.
        with contextlib.suppress(nats.js.errors.KeyNotFoundError, nats.errors.TimeoutError):
            return await relay_holder(topology)
        return None

    deadline = time.monotonic() + SETTLE_S
    while await holder() != replica_id:
        assert time.monotonic() < deadline, f"replica {replica_id} did not take the relay lease"
        await asyncio.sleep(0.5)


async def assert_the_stream_goes_on(topology: Topology, flowed: list[str], woke_at: int) -> None:
    """Threads published after the wake and spawns made after it are ready; every event once, in
    the store's order; and no node of the cluster refused a write of the stream."""
    after = [await spawn(topology.replica(replica)) for replica in ("a", "b")]
    environments = await ready_in_the_stream(topology, flowed[woke_at:] + after)
    environments += await ready_in_the_stream(topology, flowed[:woke_at])
    await assert_each_event_once_in_order(topology, environments)
    for node in NODES:
        assert "critical write error" not in topology.cluster.log(node), f"{node} stopped a stream"


async def test_a_relay_stopped_past_its_lease_while_threads_flow_publishes_nothing_when_it_wakes(
    topology: Topology,
) -> None:
    holder_id = await relay_holder(topology)
    other_id = "b" if holder_id == "a" else "a"
    holder = topology.replica(holder_id)
    assert holder.process is not None
    async with flowing(topology, list(NODES)) as flow:
        await flow.more(10)
        holder.process.send_signal(signal.SIGSTOP)
        try:
            await until_relayed_by(topology, other_id)
            await flow.more(int(4 * RATE))  # the new holder relays a while, and the old one's view grows stale
        finally:
            holder.process.send_signal(signal.SIGCONT)
        woke_at = len(flow.threads)
        await eventually(lambda: "lost lease relay" in holder.log_tail(), "the woken replica stepping down")
        await flow.more(int(4 * RATE))  # threads go on flowing past the wake
    await assert_the_stream_goes_on(topology, flow.threads, woke_at)
    assert holder.process.poll() is None


@pytest.mark.parametrize("topology", [{"nodes": {"a": ["n1"], "b": ["n2", "n3"]}}], indirect=True, ids=["a-on-n1"])
async def test_a_relay_cut_off_from_the_cluster_past_its_lease_publishes_nothing_when_it_is_back(
    topology: Topology,
) -> None:
    """Replica a reaches the cluster through node n1 alone; stopping n1 cuts it off (its connection
    open and silent, as in a partition) while b and the flow go on through n2 and n3."""
    await until_relayed_by(topology, "a")
    async with flowing(topology, ["n2", "n3"]) as flow:
        await flow.more(10)
        topology.cluster.pause("n1")
        try:
            await until_relayed_by(topology, "b")
            await flow.more(int(4 * RATE))
        finally:
            topology.cluster.resume("n1")
        woke_at = len(flow.threads)
        await flow.more(int(4 * RATE))
    topology.cluster.wait_healthy()
    await assert_the_stream_goes_on(topology, flow.threads, woke_at)
    a = topology.replica("a")
    assert a.process is not None and a.process.poll() is None
