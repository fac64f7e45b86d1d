"""SPEC section 6 against a real `bb serve`: who may connect, publish, subscribe and touch the streams."""

from __future__ import annotations

import asyncio
import json
import stat
import uuid
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.errors import APIError

from bb_environments.bus.access import SERVICE_INBOX_PREFIX, host_agent_inbox_prefix
from bb_environments.bus.wire import subjects
from tests.integration.conftest import Violations, connect_as, eventually, spawn_with_setup_held, write_hooks

FORBIDDEN_PUBLISH = [
    "bb.log.environment.00000000-0000-0000-0000-000000000000.ready",
    "bb.environments.00000000-0000-0000-0000-000000000000.ready",
    "bb.transcripts.00000000-0000-0000-0000-000000000000",
    subjects.host_transcript("local", "00000000-0000-0000-0000-000000000000"),
    "$JS.API.STREAM.PURGE.BB_TRANSCRIPT_INTAKE",
    "$JS.API.CONSUMER.MSG.NEXT.BB_TRANSCRIPT_INTAKE.transcript-intake",
    "bb.hosts.local.hooks.start",
    "bb.hosts.local.hooks.cancel",
    subjects.host_secrets("local"),  # only a host's agent asks for its hooks' secrets
    "$JS.API.STREAM.PURGE.BB_ENVIRONMENTS",
    "$JS.API.STREAM.DELETE.BB_ENVIRONMENTS",
    "$JS.API.STREAM.MSG.DELETE.BB_ENVIRONMENTS",
    "$JS.API.STREAM.UPDATE.BB_THREADS",
    "$JS.API.CONSUMER.DELETE.BB_ENVIRONMENTS.projections",
    "$JS.API.CONSUMER.MSG.NEXT.BB_ENVIRONMENTS.provisioner",
    subjects.LOG_GREW,
    subjects.ACTIVITY,
    subjects.replica_secrets("local"),  # only a replica tells another a secret's value
    "$JS.API.STREAM.PURGE.BB_PLACEMENTS",
]


async def stream_state(service, stream: str) -> tuple[int, int]:
    internal = await service.connect("service")
    try:
        state = (await internal.jetstream().stream_info(stream)).state
        return state.messages, state.last_seq
    finally:
        await internal.close()


async def test_a_connection_without_credentials_is_refused(service):
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            service.info["natsUrl"], allow_reconnect=False, connect_timeout=2, error_cb=Violations().record
        )
    wrong_seed = service.data_dir.parent / "stranger.nk"
    wrong_seed.write_bytes(b"SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU")
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            service.info["natsUrl"],
            allow_reconnect=False,
            connect_timeout=2,
            nkeys_seed=str(wrong_seed),
            error_cb=Violations().record,
        )


async def test_seeds_and_state_are_readable_by_their_owner_only(service):
    data_dir: Path = service.data_dir
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for private in [data_dir / "server.json", data_dir / "events.sqlite", *(data_dir / "credentials").iterdir()]:
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    named = service.info["credentials"]
    assert set(named) == {"operator", "publisher", "subscriber"}
    seeds = [Path(path).read_text().strip() for path in named.values()]
    written = (data_dir / "server.json").read_text() + service.log_tail()
    assert all(seed.startswith("SU") and seed not in written for seed in seeds)


@pytest.mark.parametrize("role", ["operator", "publisher", "subscriber"])
async def test_no_client_role_can_forge_the_log_run_hooks_or_touch_the_streams(service, role):
    before = await stream_state(service, subjects.ENVIRONMENTS_STREAM)
    nc, violations = await connect_as(service, role)
    try:
        for subject in FORBIDDEN_PUBLISH:
            await nc.publish(subject, b"{}")
            await violations.wait_for(f'publish to "{subject}"')
        await nc.subscribe("bb.hosts.>")
        await violations.wait_for('subscription to "bb.hosts.>"')
        await nc.subscribe(subjects.REPLICA_SECRETS_REQUESTS)
        await violations.wait_for(f'subscription to "{subjects.REPLICA_SECRETS_REQUESTS}"')
        if role != "publisher":
            await nc.publish("bb.threads.t-forged.created", b"{}")
            await violations.wait_for('publish to "bb.threads.t-forged.created"')
        if role != "operator":
            await nc.publish("bb.api.threads.archive", b"{}")
            await violations.wait_for('publish to "bb.api.threads.archive"')
    finally:
        await nc.close()
    assert await stream_state(service, subjects.ENVIRONMENTS_STREAM) == before


async def test_a_publisher_spawns_by_thread_events_and_hears_readiness(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "hooks.log")
    publisher, violations = await connect_as(service, "publisher")
    ready = asyncio.get_running_loop().create_future()
    lines: list[str] = []

    async def on_ready(message) -> None:
        if not ready.done():
            ready.set_result(json.loads(message.data))

    async def on_line(message) -> None:
        lines.append(json.loads(message.data)["text"])

    await publisher.subscribe("bb.environments.*.ready", cb=on_ready)
    await publisher.subscribe(subjects.TRANSCRIPT_EVENTS, cb=on_line)
    try:
        js = publisher.jetstream()
        created = {
            "type": "created",
            "occurredAt": "2026-12-01T12:00:00Z",
            "threadId": "pub1",
            "projectPath": str(git_repo),
            "environment": {
                "type": "provider",
                "environmentProviderId": "git-worktree",
                "machine": {"type": "existing", "hostId": "local"},
                "inputs": None,
            },
        }
        ack = await js.publish(subjects.thread_event("pub1", "created"), msgspec.json.encode(created))
        assert ack.stream == subjects.THREADS_STREAM
        await js.publish(
            subjects.thread_event("pub1", "message"),
            b'{"type": "message", "occurredAt": "2026-12-01T12:00:01Z", "threadId": "pub1"}',
        )
        event = await asyncio.wait_for(ready, 30)
        assert event["threadIds"] == ["pub1"]
        # The setup's lines come on a subject of their own, in no order with readiness.
        await eventually(lambda: "preparing the workspace" in lines, "the setup's line heard by the publisher")
    finally:
        await publisher.close()
    assert violations.seen == []


async def test_a_subscriber_has_its_own_durable_consumer_but_never_the_services(service):
    spawned = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--wait", "--json")
    assert spawned.returncode == 0, spawned.stderr
    subscriber, violations = await connect_as(service, "subscriber")
    try:
        js = subscriber.jetstream()
        mine = await js.pull_subscribe(
            subjects.LOG_ENVIRONMENT_EVENTS, durable="audit", stream=subjects.ENVIRONMENTS_STREAM
        )
        first = (await mine.fetch(1, timeout=5))[0]
        await first.ack()
        assert json.loads(first.data)["type"] == "claimed"

        for service_consumer in ("projections", "provisioner"):
            with pytest.raises((APIError, nats.errors.TimeoutError)):
                await js.delete_consumer(subjects.ENVIRONMENTS_STREAM, service_consumer)
            with pytest.raises((APIError, nats.errors.TimeoutError)):
                await js.add_consumer(
                    subjects.ENVIRONMENTS_STREAM,
                    api.ConsumerConfig(durable_name=service_consumer, deliver_policy=api.DeliverPolicy.NEW),
                )
        with pytest.raises((APIError, nats.errors.TimeoutError)):
            await js.purge_stream(subjects.ENVIRONMENTS_STREAM)
    finally:
        await subscriber.close()
    # The service's own consumers still feed it: a new spawn still becomes ready and is listed.
    again = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--wait", "--json")
    assert again.returncode == 0 and again.json()["status"] == "ready", again.stderr
    listed = (await service.bb("environment", "list", "--json")).json()["environments"]
    assert {e["id"] for e in listed} >= {spawned.json()["environmentId"], again.json()["environmentId"]}
    assert any("CONSUMER.DELETE" in seen.upper() for seen in violations.seen)


async def test_a_client_consumer_neither_takes_a_services_name_nor_reads_past_its_part_nor_reaches_an_endpoint(
    service, git_repo, tmp_path
):
    hold, marker = tmp_path / "hold-setup", tmp_path / "hooks.log"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, marker)
    subscriber, violations = await connect_as(service, "subscriber")
    create = f"$JS.API.CONSUMER.CREATE.{subjects.ENVIRONMENTS_STREAM}"

    async def create_consumer(subject: str, **config: object) -> dict:
        body = {"stream_name": subjects.ENVIRONMENTS_STREAM, "config": {"ack_policy": "explicit", **config}}
        return json.loads((await subscriber.request(subject, json.dumps(body).encode(), timeout=5)).data)

    try:
        # The service's consumer named in the body only, with a filter that would starve its read model.
        with pytest.raises(nats.errors.TimeoutError):
            await create_consumer(create, name=subjects.LOG_CONSUMER, filter_subject="bb.log.nothing.>")
        await violations.wait_for(f'publish to "{create}"')
        # Its own consumer, filtered past the environments' part of the stream.
        with pytest.raises(nats.errors.TimeoutError):
            await create_consumer(f"{create}.everything.bb.log.>", name="everything", filter_subject="bb.log.>")
        await violations.wait_for(f'publish to "{create}.everything.bb.log.>"')
        # Allowed by name and filter, but naming other filters in the body: the server refuses.
        mismatched = await create_consumer(
            f"{create}.sly.{subjects.LOG_ENVIRONMENT_EVENTS}", name="sly", filter_subjects=[subjects.LOG_EVENTS]
        )
        assert mismatched["error"]["code"] == 400, mismatched

        # Push consumers delivering the stored log onto the service's endpoints.
        for name, endpoint in (
            ("onto-hooks", subjects.host_hooks("local", "cancel")),
            ("onto-api", subjects.api("environments", "delete")),
        ):
            created = await create_consumer(
                f"{create}.{name}.{subjects.LOG_ENVIRONMENT_EVENTS}",
                name=name,
                filter_subject=subjects.LOG_ENVIRONMENT_EVENTS,
                ack_policy="none",
                deliver_subject=endpoint,
                deliver_group="q",
            )
            assert "error" not in created, created
        await eventually(
            lambda: (
                "that a JetStream consumer pushed there" in service_log(service)
                and subjects.api("environments", "delete") in service_log(service)
            ),
            "the pushed copies dropped",
        )

        # The setup the pushed copies of `setup_started` would have cancelled runs to its end.
        ready = await subscriber.subscribe(f"bb.environments.{environment_id}.ready")
        hold.unlink()
        await ready.next_msg(timeout=30)
    finally:
        await subscriber.close()
    said = service_log(service)
    assert "refused bb.hosts.local.hooks.cancel" not in said and "Traceback" not in said
    consumers = (
        await (await service.connect("service"))
        .jetstream()
        .consumer_info(subjects.ENVIRONMENTS_STREAM, subjects.LOG_CONSUMER)
    )
    assert consumers.config.filter_subject == subjects.LOG_EVENTS


def service_log(service) -> str:
    return (service.data_dir.parent / "serve.log").read_text()


async def _snooped(nc: Client, snoop: Subscription) -> list[Msg]:
    """Everything the server sent `snoop` so far: the flush's answer comes after all of it."""
    await nc.flush()
    return [await snoop.next_msg(timeout=1) for _ in range(snoop.pending_msgs)]


async def test_no_client_reads_the_services_replies_or_the_prompts_it_is_delivered(service, git_repo, tmp_path):
    """Every client role may read `_INBOX.>` for its own replies; the service's and the host
    agents' connections have their inboxes elsewhere, so what the service pulls from its consumers
    (prompts included) and the answers to its own requests never reach a client."""
    write_hooks(git_repo, tmp_path / "hooks.log")
    publisher, publisher_violations = await connect_as(service, "publisher")
    subscriber, subscriber_violations = await connect_as(service, "subscriber")
    snoops = [(publisher, await publisher.subscribe("_INBOX.>")), (subscriber, await subscriber.subscribe("_INBOX.>"))]
    try:
        for nc, violations in ((publisher, publisher_violations), (subscriber, subscriber_violations)):
            for private in (">", f"{SERVICE_INBOX_PREFIX}.>", f"{host_agent_inbox_prefix('local')}.>"):
                await nc.subscribe(private)
                await violations.wait_for(f'subscription to "{private}"')

        marker = f"prompt-{uuid.uuid4().hex}"
        js = publisher.jetstream()
        created = {
            "type": "created",
            "occurredAt": "2026-12-01T12:00:00Z",
            "threadId": "snooped",
            "projectPath": str(git_repo),
            "environment": {
                "type": "provider",
                "environmentProviderId": "git-worktree",
                "machine": {"type": "existing", "hostId": "local"},
                "inputs": None,
            },
        }
        await js.publish(subjects.thread_event("snooped", "created"), msgspec.json.encode(created))
        message = {
            "type": "message",
            "occurredAt": "2026-12-01T12:00:01Z",
            "threadId": "snooped",
            "text": f"the secret plan: {marker}",
        }
        await js.publish(subjects.thread_event("snooped", "message"), msgspec.json.encode(message))
        thread = await service.wait_for_thread("snooped", having="environmentId")
        await service.wait_for(thread["environmentId"], "ready")

        spawned = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "personal-workspace",
            "--prompt",
            f"another secret: {marker}",
            "--wait",
            "--json",
        )
        assert spawned.returncode == 0 and spawned.json()["status"] == "ready", spawned.stderr
        listed = await service.bb("environment", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        await service.thread_events_handled()
        # Its own replies still reach a client's `_INBOX.>` subscription.
        await subscriber.jetstream().stream_info(subjects.ENVIRONMENTS_STREAM)

        for nc, snoop in snoops:
            seen = await _snooped(nc, snoop)
            assert seen, "the snooping subscription saw not even its own connection's replies"
            assert [m.subject for m in seen if marker.encode() in m.data] == []
            assert [m.subject for m in seen if m.subject.startswith(SERVICE_INBOX_PREFIX)] == []
    finally:
        await publisher.close()
        await subscriber.close()
