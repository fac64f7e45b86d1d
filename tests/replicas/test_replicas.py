"""Two `bb serve` replicas on one PostgreSQL store and a 3-node NATS cluster, with a host agent of
their own (SPEC 7.2): the work is shared, and the death of a replica, of a NATS node or of the
store's connection changes none of the guarantees. Every part is a real process on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from bb_environments.bus.access import SERVICE_INBOX_PREFIX
from bb_environments.bus.api_client.nats_client import ApiClient
from bb_environments.bus.core.replicas import PRESENCE_TTL_S
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import EnvironmentRef, ListThreads, RegisterHost, SpawnThread, ThreadRef
from bb_environments.bus.wire.service_errors import ServiceError
from bb_environments.bus.wire.thread_events import Machine, ProviderIntent, ThreadCreatedMessage, ThreadMessageMessage
from scripts.engines import NatsCluster, PostgresServer
from tests.integration.conftest import Service, eventually, service_environment, write_hooks
from tests.integration.host_agents import Agent
from tests.replicas.conftest import publish_stored

HOST = "h1"
CLOUD_PAUSABLE = "tests.support.gated_provider:CloudPausableProvider"
SETTLE_S = 90


@dataclass
class Topology:
    cluster: NatsCluster
    postgres: PostgresServer
    replicas: dict[str, Service]
    agent: Agent
    base: Path
    store: str
    everywhere: dict[str, str]
    """Variables in the environment of every replica and of the agent."""
    nodes: dict[str, list[str]] = field(default_factory=dict)
    """The nodes a replica is given in BB_NATS_URL, if not all (it learns of the others from them)."""

    def replica(self, replica_id: str) -> Service:
        return self.replicas[replica_id]

    def environment(self, replica_id: str, **overrides: str) -> dict[str, str]:
        return service_environment(
            self.base / replica_id / "data",
            BB_NATS_URL=self.cluster.urls_of(self.nodes[replica_id]) if replica_id in self.nodes else self.cluster.urls,
            BB_NATS_NKEY=str(self.cluster.seed_file("service")),
            BB_EVENT_STORE=self.store,
            BB_STREAM_REPLICAS="3",
            BB_REPLICA_ID=replica_id,
            BB_HOST_ID=f"core-{replica_id}",
            **{**self.everywhere, **overrides},
        )

    async def start_replica(self, replica_id: str) -> Service:
        service = self.replicas.get(replica_id) or Service(
            self.base / replica_id / "data", self.environment(replica_id)
        )
        service.external_credentials = {"nkeys_seed": str(self.cluster.seed_file("operator"))}
        service.data_dir.parent.mkdir(parents=True, exist_ok=True)
        await service.start("--no-agent")
        self.replicas[replica_id] = service
        return service

    async def service_connection(self) -> nats.aio.client.Client:
        return await nats.connect(
            self.cluster.urls.split(","),
            nkeys_seed=str(self.cluster.seed_file("service")),
            inbox_prefix=SERVICE_INBOX_PREFIX,
        )


@pytest.fixture
async def topology(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_server: PostgresServer, postgres_url: str
) -> AsyncIterator[Topology]:
    """Replicas a (started first: it takes the relay) and b, and the agent of host h1. Parametrize it
    indirectly with a dict to add variables to replica a's environment; its `everywhere` dict adds
    them to every replica's and the agent's, its `nodes` dict names the nodes a replica connects to."""
    overrides = dict(getattr(request, "param", {}))
    everywhere, nodes = overrides.pop("everywhere", {}), overrides.pop("nodes", {})
    cluster = NatsCluster.start(tmp_path / "nats")
    topology = Topology(cluster, postgres_server, {}, None, tmp_path, postgres_url, everywhere, nodes)  # type: ignore[arg-type]
    try:
        topology.replicas["a"] = Service(tmp_path / "a" / "data", topology.environment("a", **overrides))
        await topology.start_replica("a")
        await topology.start_replica("b")
        first = topology.replica("a")
        assert first.api is not None
        registered = await ask(first, "machines", "register", RegisterHost(host_id=HOST))
        seed = Path(registered["credentials"])
        cluster.admit_host(HOST, seed)
        topology.agent = Agent(first, HOST, seed, tmp_path / HOST)
        topology.agent.start(**everywhere)
        await topology.agent.serving()
        yield topology
    finally:
        if topology.agent is not None:
            topology.agent.stop()
        for service in topology.replicas.values():
            with contextlib.suppress(Exception):
                if service.process is not None:
                    service.process.send_signal(signal.SIGCONT)
                await service.stop()
        cluster.stop()


async def ask(service: Service, area: str, verb: str, body: Any) -> Any:
    """A request sent again, as an integrator would, while it is cut off or unanswered (a node or a
    replica gone mid-request); every request these tests send is idempotent."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        if service.api is None or service.api.nc.is_closed:
            service.api = await ApiClient.connect(service.info["natsUrl"], **service.credentials("operator"))
        try:
            return await service.api.call(area, verb, body, timeout=10)
        except ServiceError as cut_off:  # lost, or nobody subscribed while both replicas reconnect
            if cut_off.code != "unreachable" or time.monotonic() > deadline:
                raise


async def spawn(service: Service, repo: Path | None = None) -> str:
    thread_id = f"t-{uuid.uuid4().hex[:16]}"
    request = (
        SpawnThread(thread_id=thread_id, environment_provider="git-worktree", project_path=str(repo), host_id=HOST)
        if repo
        else SpawnThread(thread_id=thread_id, environment_provider="personal-workspace", host_id=HOST)
    )
    return (await ask(service, "threads", "spawn", request))["threadId"]


async def environment_of(service: Service, thread_id: str) -> str:
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = None
        while True:
            page = await ask(service, "threads", "list", ListThreads(after=after))
            for thread in page["threads"]:
                if thread["id"] == thread_id and thread["environmentId"]:
                    return str(thread["environmentId"])
            if (after := page.get("next")) is None:
                break
        assert time.monotonic() < deadline, f"thread {thread_id} has no environment after {SETTLE_S} s"
        await asyncio.sleep(0.2)


async def settled(service: Service, environment_ids: list[str], status: str) -> None:
    """Each environment in `status`, as `service`'s read model says."""
    deadline = time.monotonic() + SETTLE_S
    for environment_id in environment_ids:
        while (
            seen := (await ask(service, "environments", "show", EnvironmentRef(environment_id=environment_id)))[
                "status"
            ]
        ) != status:
            assert time.monotonic() < deadline, f"environment {environment_id} is {seen}, not {status}"
            await asyncio.sleep(0.2)


async def stream_log(topology: Topology) -> list[tuple[str, dict[str, Any], int]]:
    """Every message of BB_ENVIRONMENTS in stream order: (subject, document, notification id)."""
    nc = await topology.service_connection()
    try:
        js = nc.jetstream()
        state = (await js.stream_info(subjects.ENVIRONMENTS_STREAM)).state
        found = []
        for sequence in range(state.first_seq, state.last_seq + 1):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                message = await _read_through_an_election(js, sequence)
                found.append(
                    (
                        message.subject or "",
                        json.loads(message.data or b"{}"),
                        subjects.claimed_notification_id(message.headers) or 0,
                    )
                )
        return found
    finally:
        await nc.close()


async def _read_through_an_election(js: Any, sequence: int, timeout: float = 30) -> Any:
    """BB_ENVIRONMENTS's message at `sequence`, asked again while a cluster healed a moment ago
    answers 503 (its stream's leader not elected yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await js.get_msg(subjects.ENVIRONMENTS_STREAM, sequence)
        except nats.js.errors.ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def assert_each_event_once_in_order(topology: Topology, environment_ids: list[str]) -> None:
    """Every environment event once in the stream, versions gap-free from 1; the log in store order."""
    log = await stream_log(topology)
    notification_ids = [n for _, _, n in log]
    assert notification_ids == sorted(set(notification_ids)), "the stream doubled or reordered the log"
    versions: dict[str, list[int]] = {e: [] for e in environment_ids}
    for subject, document, _ in log:
        if subject.startswith("bb.log.environment.") and document.get("environmentId") in versions:
            versions[document["environmentId"]].append(document["version"])
    for environment_id, seen in versions.items():
        assert seen == list(range(1, len(seen) + 1)), f"environment {environment_id}: versions {seen}"
    ready = Counter(document["environmentId"] for subject, document, _ in log if document.get("type") == "ready")
    assert all(ready[e] == 1 for e in environment_ids), f"readiness not once each: {ready}"


async def test_both_replicas_answer_and_drive_and_each_event_is_stored_once(topology: Topology) -> None:
    a, b = topology.replica("a"), topology.replica("b")
    # Each replica drives a share: b takes its partitions a moment after a gives them up, and the
    # spawns below are driven by both only once it has.
    for replica in (a, b):
        await eventually(
            lambda: "drives partitions" in (replica.data_dir.parent / "serve.log").read_text(),
            f"replica {replica.data_dir.parent.name} taking its share of the partitions",
        )
    threads = await asyncio.gather(*(spawn(service) for service in [a, b] * 10))
    environments = [await environment_of(a, t) for t in threads]
    await settled(a, environments, "ready")
    await settled(b, environments, "ready")  # each replica's own read model knows them all
    await assert_each_event_once_in_order(topology, environments)


async def test_a_second_replica_of_one_id_and_a_replica_beside_an_sqlite_store_are_refused(topology: Topology) -> None:
    twin = topology.environment("a")
    twin["BB_DATA_DIR"] = str(topology.base / "twin" / "data")
    refused = subprocess.run(
        [*Service.cli(), "serve", "--no-agent"], env=twin, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "replica a is running already" in refused.stderr
    sqlite = topology.environment("lonely")
    del sqlite["BB_EVENT_STORE"]
    refused = subprocess.run(
        [*Service.cli(), "serve", "--no-agent"], env=sqlite, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "an SQLite event store has one replica only" in refused.stderr
    assert not (topology.base / "lonely" / "data" / "events.sqlite").exists()


async def test_the_other_replica_finishes_spawns_and_archives_after_one_is_killed(
    topology: Topology, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    write_hooks(git_repo, marker, setup="sleep 1")
    a, b = topology.replica("a"), topology.replica("b")
    early = await asyncio.gather(*(spawn(b) for _ in range(4)))
    early_environments = [await environment_of(b, t) for t in early]
    await settled(b, early_environments, "ready")
    threads = await asyncio.gather(*(spawn(service, git_repo) for service in [a, b] * 4))
    for thread in early[:2]:
        await ask(b, "threads", "archive", ThreadRef(thread_id=thread))
    a.kill()  # while creates, setups and removals are in flight
    environments = [await environment_of(b, t) for t in threads]
    await settled(b, environments, "ready")
    await settled(b, early_environments[:2], "removed")
    assert marker.read_text().count("setup") == len(environments), "a setup ran twice, or never"
    await assert_each_event_once_in_order(topology, environments + early_environments)


async def test_an_agent_killed_mid_flow_and_started_again_runs_each_hook_once_for_both_replicas(
    topology: Topology, git_repo: Path, tmp_path: Path
) -> None:
    """Both replicas queue h1's creates, setups and removals; the agent dies with them in flight."""
    marker = tmp_path / "hooks"
    write_hooks(git_repo, marker, setup="sleep 1", teardown="true")
    a, b = topology.replica("a"), topology.replica("b")
    early = await asyncio.gather(*(spawn(service, git_repo) for service in [a, b]))
    early_environments = [await environment_of(a, t) for t in early]
    await settled(a, early_environments, "ready")
    threads = await asyncio.gather(*(spawn(service, git_repo) for service in [a, b] * 3))
    for thread in early:
        await ask(b, "threads", "archive", ThreadRef(thread_id=thread))
    await eventually(
        lambda: marker.exists() and marker.read_text().count("setup") > len(early),
        "a setup of the second round under way",
        timeout=SETTLE_S,
    )
    topology.agent.kill()
    topology.agent.start()
    await topology.agent.serving()
    environments = [await environment_of(b, t) for t in threads]
    await settled(a, environments, "ready")
    await settled(b, early_environments, "removed")
    hooks = marker.read_text().split()
    assert hooks.count("setup") == len(early) + len(threads), f"a setup ran twice, or never: {hooks}"
    assert hooks.count("teardown") == len(early), f"a teardown ran twice, or never: {hooks}"
    await assert_each_event_once_in_order(topology, environments + early_environments)


@pytest.mark.parametrize(
    "topology",
    [{"BB_CRASH_AT": f"{point}#2"} for point in ("created-recorded", "relay-published", "placement-published")],
    indirect=True,
    ids=lambda overrides: overrides["BB_CRASH_AT"],
)
async def test_the_other_replica_finishes_what_one_killed_at_a_crash_point_left(
    topology: Topology, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    write_hooks(git_repo, marker, setup="sleep 0.5")
    a, b = topology.replica("a"), topology.replica("b")
    threads = list(await asyncio.gather(*(spawn(service, git_repo) for service in [b, a] * 4)))
    assert a.process is not None
    # Which replica drives an environment falls by its id's partition: should every one be ready
    # with replica a still running, it drove fewer than two, and more are spawned through b.
    deadline = time.monotonic() + SETTLE_S
    while a.process.poll() is None:
        assert time.monotonic() < deadline, "replica a never reached its crash point"
        environments = [await environment_of(b, t) for t in threads]
        shown = [await ask(b, "environments", "show", EnvironmentRef(environment_id=e)) for e in environments]
        if a.process.poll() is None and all(environment["status"] == "ready" for environment in shown):
            threads += await asyncio.gather(*(spawn(b, git_repo) for _ in range(4)))
        await asyncio.sleep(0.2)
    environments = [await environment_of(b, t) for t in threads]
    await settled(b, environments, "ready")
    assert marker.read_text().count("setup") == len(environments), "a setup ran twice, or never"
    await assert_each_event_once_in_order(topology, environments)


async def publish_threads(topology: Topology, count: int) -> list[str]:
    """New threads asking for a personal workspace on h1, as a publishing service sends them."""
    nc = await nats.connect(topology.cluster.urls.split(","), nkeys_seed=str(topology.cluster.seed_file("publisher")))
    try:
        threads = [f"t-{uuid.uuid4().hex[:16]}" for _ in range(count)]
        for thread in threads:
            await publish_thread(nc.jetstream(), thread)
        return threads
    finally:
        await nc.close()


async def publish_thread(js: nats.js.JetStreamContext, thread: str) -> None:
    """A thread's `created` (asking for a personal workspace on h1) and first message."""
    intent = ProviderIntent(environment_provider_id="personal-workspace", machine=Machine(host_id=HOST))
    for event in (
        ThreadCreatedMessage(thread_id=thread, environment=intent),
        ThreadMessageMessage(thread_id=thread, text="go"),
    ):
        await publish_stored(js, event, SETTLE_S)


@pytest.mark.parametrize(
    "topology", [{"everywhere": {"BB_EXTRA_PROVIDERS": CLOUD_PAUSABLE}}], indirect=True, ids=["cloud-pausable"]
)
async def test_a_message_resumes_a_paused_environment_whichever_replica_hears_it(
    topology: Topology, tmp_path: Path
) -> None:
    """A thread's message comes through the replica that consumes its thread's partition, which is
    often not the one that drives its environment, paused after 0.3 s idle (a cloud provider's,
    which the replicas run themselves, as Modal's)."""
    a, b = topology.replica("a"), topology.replica("b")
    for replica in (a, b):
        gates = replica.data_dir / "providers" / "cloud-pausable" / "gates"
        gates.mkdir(parents=True, exist_ok=True)
        for gate in ("create", "remove"):
            (gates / gate).touch()
    project = tmp_path / "project"
    project.mkdir()
    threads = [
        (
            await ask(
                service,
                "threads",
                "spawn",
                SpawnThread(
                    thread_id=f"t-{uuid.uuid4().hex[:16]}",
                    environment_provider="cloud-pausable",
                    project_path=str(project),
                    host_id=HOST,
                ),
            )
        )["threadId"]
        for service in [a, b] * 3
    ]
    environments = [await environment_of(a, t) for t in threads]
    deadline = time.monotonic() + SETTLE_S
    for environment_id in environments:
        while (await ask(a, "environments", "show", EnvironmentRef(environment_id=environment_id)))["pausedAt"] is None:
            assert time.monotonic() < deadline, f"environment {environment_id} was never paused"
            await asyncio.sleep(0.2)

    publisher = await nats.connect(
        topology.cluster.urls.split(","), nkeys_seed=str(topology.cluster.seed_file("publisher"))
    )
    try:
        for thread in threads:
            await publisher.jetstream().publish(
                subjects.thread_event(thread, "message"),
                msgspec.json.encode(ThreadMessageMessage(thread_id=thread, text="go on")),
            )
    finally:
        await publisher.close()

    async def resumed() -> set[str]:
        return {
            document["environmentId"]
            for _, document, _ in await stream_log(topology)
            if document.get("type") == "resumed"
        }

    while not set(environments) <= (seen := await resumed()):
        assert time.monotonic() < deadline + SETTLE_S, f"not resumed: {set(environments) - seen}"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("stream", [subjects.ENVIRONMENTS_STREAM, subjects.THREAD_PARTITIONS_STREAM])
async def test_killing_the_node_leading_a_stream_stops_no_replica(topology: Topology, stream: str) -> None:
    a, b = topology.replica("a"), topology.replica("b")
    leader = topology.cluster.leader_of(stream)
    assert leader is not None
    threads = list(await asyncio.gather(*(spawn(service) for service in [a, b] * 3)))
    threads += await publish_threads(topology, 4)
    topology.cluster.kill(leader)
    threads += await asyncio.gather(*(spawn(service) for service in [a, b] * 3))
    threads += await publish_threads(topology, 4)
    environments = [await environment_of(a, t) for t in threads]
    await settled(a, environments, "ready")
    assert a.process is not None and b.process is not None
    assert a.process.poll() is None and b.process.poll() is None, "a replica exited"
    topology.cluster.start_node(leader)
    await assert_each_event_once_in_order(topology, environments)


async def test_every_command_completes_across_a_postgresql_restart(topology: Topology) -> None:
    a, b = topology.replica("a"), topology.replica("b")
    # The spawns' tasks send their requests while the restart runs on its thread: both in flight at once.
    first = asyncio.gather(*(spawn(service) for service in [a, b] * 5))
    await asyncio.to_thread(topology.postgres.restart)
    threads = list(await first)
    threads += await asyncio.gather(*(spawn(service) for service in [a, b] * 3))
    environments = [await environment_of(b, t) for t in threads]
    await settled(b, environments, "ready")
    await assert_each_event_once_in_order(topology, environments)


async def ready_in_the_stream(topology: Topology, thread_ids: list[str]) -> list[str]:
    """The environments of these threads once each is ready in the stream, read from the stream
    alone: a stopped replica still takes its turn at API requests until NATS finds it gone."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        ready = {
            thread: document["environmentId"]
            for subject, document, _ in await stream_log(topology)
            if document.get("type") == "ready"
            for thread in document.get("threadIds", [])
        }
        if all(t in ready for t in thread_ids):
            return [ready[t] for t in thread_ids]
        assert time.monotonic() < deadline, f"not ready within {SETTLE_S} s: {set(thread_ids) - set(ready)}"
        await asyncio.sleep(0.5)


async def relay_holder(topology: Topology) -> str:
    return await lease_holder(topology, subjects.RELAY_LEASE)


async def lease_holder(topology: Topology, lease: str) -> str:
    nc = await topology.service_connection()
    try:
        leases = await nc.jetstream().key_value(subjects.LEASES_BUCKET)
        return json.loads((await leases.get(lease)).value or b"{}")["replicaId"]
    finally:
        await nc.close()


async def test_a_stopped_relay_is_replaced_and_steps_down_when_it_wakes(topology: Topology) -> None:
    holder_id = await relay_holder(topology)
    other_id = "b" if holder_id == "a" else "a"
    holder, other = topology.replica(holder_id), topology.replica(other_id)
    assert holder.process is not None
    holder.process.send_signal(signal.SIGSTOP)
    try:
        threads = await asyncio.gather(*(spawn(other) for _ in range(6)))
        environments = await ready_in_the_stream(topology, threads)  # relayed by the other replica
        assert await relay_holder(topology) == other_id
    finally:
        holder.process.send_signal(signal.SIGCONT)
    await eventually(lambda: "lost lease relay" in holder.log_tail(), "the woken replica stepping down")
    more = await asyncio.gather(*(spawn(service) for service in (holder, other) * 3))
    environments += [await environment_of(other, t) for t in more]
    await settled(other, environments, "ready")
    await assert_each_event_once_in_order(topology, environments)
    assert holder.process.poll() is None


async def test_nested_claims_decided_by_both_replicas_at_once_never_overlap(topology: Topology, git_repo: Path) -> None:
    a, b = topology.replica("a"), topology.replica("b")

    async def checkout(service: Service, inputs: dict[str, str] | None) -> Any:
        return await ask(
            service,
            "threads",
            "spawn",
            SpawnThread(
                thread_id=f"t-{uuid.uuid4().hex[:16]}",
                environment_provider="project-checkout",
                project_path=str(git_repo),
                environment_inputs=inputs,
                host_id=HOST,
            ),
        )

    rounds = 4
    for round_ in range(rounds):  # each round a directory and one inside it, asked of both replicas at once
        (git_repo / f"d{round_}" / "inner").mkdir(parents=True)
        await asyncio.gather(
            *(
                checkout(service, {"path": path})
                for service, path in [
                    (a, f"d{round_}"),
                    (b, f"d{round_}/inner"),
                    (b, f"d{round_}"),
                    (a, f"d{round_}/inner"),
                ]
            ),
            return_exceptions=True,
        )
    held: dict[str, str] = {}
    taken = 0
    for _, document, _ in await stream_log(topology):
        if document.get("type") == "host_claims_held":
            path = document["path"]
            nested = [p for p in held if p == path or p.startswith(path + "/") or path.startswith(p + "/")]
            assert not nested or held[nested[0]] == document["environmentId"], (
                f"{path} taken while {nested} was held by {held[nested[0]]}"
            )
            held[path] = document["environmentId"]
            taken += 1
        elif document.get("type") == "host_claims_released":
            held.pop(document["path"], None)
    assert taken >= rounds, "a round took no claim at all"


LIMIT = 3


@pytest.mark.parametrize(
    "topology", [{"everywhere": {"BB_MAX_LIVE_ENVIRONMENTS": str(LIMIT)}}], indirect=True, ids=["limit-3"]
)
async def test_the_host_limit_holds_for_spawns_decided_by_both_replicas_at_once(topology: Topology) -> None:
    # Each new environment with a path takes it in its host's claims, in the same save: of two
    # replicas deciding at once, one loses the race, reads the other's environment and decides again.
    a, b = topology.replica("a"), topology.replica("b")
    outcomes = await asyncio.gather(*(spawn(service) for service in [a, b] * 4), return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, ServiceError)]
    assert len(refused) == len(outcomes) - LIMIT, "\n".join(map(repr, outcomes))
    assert all(f"BB_MAX_LIVE_ENVIRONMENTS ({LIMIT})" in str(error) for error in refused), refused
    claimed = {
        document["environmentId"] for _, document, _ in await stream_log(topology) if document.get("type") == "claimed"
    }
    assert len(claimed) == LIMIT


async def test_a_replica_beside_a_running_sqlite_replica_is_refused_however_long_it_has_run(
    nats_cluster: NatsCluster, tmp_path: Path, postgres_url: str
) -> None:
    def replica_environment(replica_id: str, **overrides: str) -> dict[str, str]:
        return service_environment(
            tmp_path / replica_id / "data",
            BB_NATS_URL=nats_cluster.urls,
            BB_NATS_NKEY=str(nats_cluster.seed_file("service")),
            BB_STREAM_REPLICAS="3",
            BB_REPLICA_ID=replica_id,
            **overrides,
        )

    (tmp_path / "only").mkdir()
    only = Service(tmp_path / "only" / "data", replica_environment("only"))
    only.external_credentials = {"nkeys_seed": str(nats_cluster.seed_file("operator"))}
    await only.start("--no-agent")
    try:
        await asyncio.sleep(PRESENCE_TTL_S + 1)  # past the presence a replica would leave if it stopped writing it
        beside = subprocess.run(
            [*Service.cli(), "serve", "--no-agent"],
            capture_output=True,
            text=True,
            timeout=60,
            env=replica_environment("beside", BB_EVENT_STORE=postgres_url),
        )
        assert beside.returncode != 0
        assert "replica only" in beside.stderr and "an SQLite event store has one replica only" in beside.stderr
    finally:
        await only.stop()


async def transcript_lines(topology: Topology, environment_id: str) -> list[str]:
    """The environment's hook lines as BB_TRANSCRIPTS keeps them, in order."""
    nc = await topology.service_connection()
    try:
        js, texts = nc.jetstream(), []
        state = (await js.stream_info(subjects.TRANSCRIPTS_STREAM)).state
        for sequence in range(state.first_seq, state.last_seq + 1):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                message = await js.get_msg(subjects.TRANSCRIPTS_STREAM, sequence)
                if message.subject == subjects.transcript(environment_id):
                    texts.append(json.loads(message.data or b"{}")["text"])
    finally:
        await nc.close()
    return [text for text in texts if text.startswith(("preparing", "numbered-"))]


async def test_the_agents_lines_reach_the_transcripts_through_one_replica_then_the_other_once_it_is_killed(
    topology: Topology, git_repo: Path, tmp_path: Path
) -> None:
    """h1's `bb agent` writes its setup's lines into the intake; the replica holding its lease keeps
    them, and once that replica is killed, the other does; each line once, in order."""
    write_hooks(git_repo, tmp_path / "hooks", setup="for n in 1 2 3; do echo numbered-$n; done")
    before = await environment_of(topology.replica("a"), await spawn(topology.replica("a"), git_repo))
    await settled(topology.replica("a"), [before], "ready")
    holder_id = await lease_holder(topology, subjects.TRANSCRIPT_INTAKE_LEASE)
    other = topology.replica("b" if holder_id == "a" else "a")
    topology.replica(holder_id).kill()
    after = await environment_of(other, await spawn(other, git_repo))
    await settled(other, [after], "ready")
    expected = ["preparing the workspace", "numbered-1", "numbered-2", "numbered-3"]
    deadline = time.monotonic() + SETTLE_S
    for environment_id in (before, after):
        while (seen := await transcript_lines(topology, environment_id)) != expected:
            assert time.monotonic() < deadline, f"the transcript of {environment_id} holds {seen}, not {expected}"
            await asyncio.sleep(0.5)


async def test_one_spawn_taken_by_both_replicas_at_once_is_answered_alike_by_each(topology: Topology) -> None:
    """What a client's resend does when the replica that took the first attempt is slow to answer:
    the other takes the same spawn while the first is being saved. Both answer with its environment."""
    for n in range(6):
        spawn = SpawnThread(thread_id=f"both-{n}", environment_provider="personal-workspace", host_id=HOST)
        answers = await asyncio.gather(
            *(topology.replica(replica).api.call("threads", "spawn", spawn) for replica in ("a", "b")),
            return_exceptions=True,
        )
        assert all(isinstance(answer, dict) for answer in answers), answers
        assert len({answer["environmentId"] for answer in answers}) == 1, answers


async def test_a_writer_frozen_holding_the_logs_lock_is_ended_and_the_saves_of_the_others_go_on(
    topology: Topology,
) -> None:
    # A session that took the log's table lock and sent nothing more, as a replica frozen half way
    # through a save's pipeline does: PostgreSQL would let it hold the lock for as long as it lives.
    import psycopg

    with psycopg.connect(topology.store) as frozen:
        (table,) = frozen.execute(
            "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE tablename LIKE '%\\_events'"
        ).fetchone() or (None,)
        frozen.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")

        thread_id = await spawn(topology.replica("a"))

        assert await environment_of(topology.replica("b"), thread_id)
        with pytest.raises(psycopg.OperationalError):
            frozen.execute("SELECT 1")  # the replicas ended it
    logs = topology.replica("a").log_tail() + topology.replica("b").log_tail()
    assert "held the log's table lock for over" in logs
