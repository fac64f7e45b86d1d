"""SPEC section 8.1 against a real `bb serve`: every thread hears its placement outcome once, on
`bb.placements.<threadId>.<status>`, and publishers and subscribers may ask the read-only API."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bb_environments.bus.wire import subjects
from tests.integration.conftest import Service, connect_as, service_environment, write_hooks

PERSONAL = {"type": "provider", "environmentProviderId": "personal-workspace"}
PROMPT = "PROMPT-c4f1 please refactor the billing module"
SECRET = "SECRET-9b2e"


async def publish(service: Service, thread_id: str, kind: str, **fields: Any) -> None:
    publisher = await service.connect("publisher")
    try:
        body = {"type": kind, "occurredAt": "2026-12-01T12:00:00Z", "threadId": thread_id, **fields}
        await publisher.jetstream().publish(subjects.thread_event(thread_id, kind), msgspec.json.encode(body))
    finally:
        await publisher.close()


async def spawn(service: Service, thread_id: str, **created: Any) -> None:
    """A thread's `created` and first `message`, as a publisher sends them."""
    await publish(service, thread_id, "created", **created)
    await publish(service, thread_id, "message", text=PROMPT)


async def heard(service: Service, thread_id: str, role: str = "subscriber") -> list[dict[str, Any]]:
    """Every outcome `BB_PLACEMENTS` holds for the thread, read as `role` with a consumer of its own."""
    nc, violations = await connect_as(service, role)
    try:
        js = nc.jetstream()
        name = f"test-{uuid.uuid4().hex[:8]}"
        consumer = await js.pull_subscribe(
            f"bb.placements.{thread_id}.>", durable=name, stream=subjects.PLACEMENTS_STREAM
        )
        pending = (await consumer.consumer_info()).num_pending
        outcomes = []
        while len(outcomes) < pending:
            for message in await consumer.fetch(pending - len(outcomes), timeout=5):
                outcomes.append(json.loads(message.data) | {"subject": message.subject})
                await message.ack()
        await js.delete_consumer(subjects.PLACEMENTS_STREAM, name)
    finally:
        await nc.close()
    assert violations.seen == []
    return outcomes


async def hears(service: Service, thread_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = [o for o in await heard(service, thread_id) if o["status"] == status]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"thread {thread_id} never heard {status}: {await heard(service, thread_id)}")
        await asyncio.sleep(0.1)


async def settled(service: Service, timeout: float = 60) -> None:
    """Every thread event handled and every message of the log taken by the service's follower."""
    await service.thread_events_handled(timeout)
    nc = await service.connect("service")
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while True:
            log = (await js.stream_info(subjects.ENVIRONMENTS_STREAM)).state.last_seq
            follower = await js.consumer_info(subjects.ENVIRONMENTS_STREAM, subjects.LOG_CONSUMER)
            if follower.delivered.stream_seq >= log and follower.num_ack_pending == 0 and follower.num_pending == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError("the log's follower did not catch up")
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


def assert_content_withheld(outcome: dict[str, Any]) -> None:
    assert outcome["reason"] and "\n" not in outcome["reason"], outcome
    assert PROMPT not in outcome["reason"] and SECRET not in outcome["reason"], outcome


async def test_a_new_environment_and_the_threads_that_join_it_each_hear_ready_once(service, git_repo):
    await spawn(service, "t1", environment=PERSONAL)
    first = await hears(service, "t1", "ready")
    assert first["type"] == "placement" and first["subject"] == "bb.placements.t1.ready"
    assert first["threadId"] == "t1" and first["reason"] is None and first["occurredAt"]
    environment_id = first["environmentId"]
    assert (await service.show(environment_id))["status"] == "ready"

    # Joining an environment that is ready already: by its id, and as a child of a thread on it.
    await spawn(service, "t2", environment={"type": "existing", "environmentId": environment_id})
    await spawn(service, "t3", parentThreadId="t1")
    for joined in ("t2", "t3"):
        assert (await hears(service, joined, "ready"))["environmentId"] == environment_id

    # A shared checkout: the second thread joins the first one's environment.
    checkout = {"type": "provider", "environmentProviderId": "project-checkout"}
    await spawn(service, "t4", projectPath=str(git_repo), environment=checkout)
    shared = (await hears(service, "t4", "ready"))["environmentId"]
    await settled(service)
    for thread_id in ("t1", "t2", "t3", "t4"):
        assert [o["status"] for o in await heard(service, thread_id)] == ["ready"], thread_id
    assert shared != environment_id


async def test_threads_archived_as_soon_as_their_environment_is_ready_still_hear_ready(service):
    """A publisher that archives a thread the moment `bb.environments.*.ready` says so: the
    environment has moved on by the time its `ready` reaches the placements, and was ready all the same."""
    threads = [f"quick{n}" for n in range(20)]
    publisher = await service.connect("publisher")
    try:
        js = publisher.jetstream()

        async def archive_once_ready(message) -> None:
            for thread_id in json.loads(message.data)["threadIds"]:
                body = {"type": "archived", "occurredAt": "2026-12-01T12:00:00Z", "threadId": thread_id}
                await js.publish(subjects.thread_event(thread_id, "archived"), msgspec.json.encode(body))

        await publisher.subscribe("bb.environments.*.ready", cb=archive_once_ready)
        for thread_id in threads:
            await spawn(service, thread_id, environment=PERSONAL)
        environments = {thread_id: (await hears(service, thread_id, "ready"))["environmentId"] for thread_id in threads}
        await settled(service)
        for thread_id in threads:
            assert [o["status"] for o in await heard(service, thread_id)] == ["ready"], thread_id
        # In the order the environment lived it: each `ready` stored before its environment's `removed`.
        for thread_id, environment_id in environments.items():
            await service.wait_for(environment_id, "removed")
            ready = await last_stored(service, subjects.PLACEMENTS_STREAM, subjects.placement(thread_id, "ready"))
            removed = await last_stored(
                service, subjects.ENVIRONMENTS_STREAM, f"bb.log.environment.{environment_id}.removed"
            )
            assert ready.time is not None and removed.time is not None and ready.time < removed.time, thread_id
    finally:
        await publisher.close()


async def last_stored(service: Service, stream: str, subject: str) -> Any:
    nc = await service.connect("service")
    try:
        return await nc.jetstream().get_last_msg(stream, subject)
    finally:
        await nc.close()


async def test_a_failing_setup_is_heard_as_error(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "hooks.log", setup="echo broken; exit 3")
    await spawn(
        service,
        "t1",
        projectPath=str(git_repo),
        environment={"type": "provider", "environmentProviderId": "git-worktree"},
    )
    failed = await hears(service, "t1", "error")
    assert failed["subject"] == "bb.placements.t1.error" and failed["environmentId"]
    assert failed["reason"] == (await service.show(failed["environmentId"]))["statusMessage"]
    await settled(service)
    assert [o["status"] for o in await heard(service, "t1")] == ["error"]


async def test_refusals_are_heard_with_their_reason_and_never_the_events_content(service, git_repo, git):
    await spawn(
        service,
        "unknown-provider",
        environment={"type": "provider", "environmentProviderId": "no-such-provider", "inputs": {"token": SECRET}},
    )
    refused = await hears(service, "unknown-provider", "refused")
    assert refused["environmentId"] is None and "no-such-provider" in refused["reason"]
    assert_content_withheld(refused)

    publisher = await service.connect("publisher")
    try:
        await publisher.jetstream().publish(
            subjects.thread_event("malformed", "created"),
            f'{{"type": "created", "threadId": "malformed", "{SECRET}": 1'.encode(),
        )
    finally:
        await publisher.close()
    assert_content_withheld(await hears(service, "malformed", "refused"))

    await publish(service, "ghost", "message", text=PROMPT)
    assert_content_withheld(await hears(service, "ghost", "refused"))

    git(git_repo, "branch", "feature")
    checkout = {"type": "provider", "environmentProviderId": "project-checkout"}
    switch = {
        "type": "provider",
        "environmentProviderId": "project-checkout",
        "inputs": {"branch": {"kind": "existing", "name": "feature"}},
    }
    await spawn(service, "holder", projectPath=str(git_repo), environment=checkout)
    await hears(service, "holder", "ready")
    await spawn(service, "claimant", projectPath=str(git_repo), environment=switch)
    claimed = await hears(service, "claimant", "refused")
    assert "claim" in claimed["reason"]
    assert_content_withheld(claimed)
    await settled(service)
    for thread_id in ("malformed", "claimant"):
        assert [o["status"] for o in await heard(service, thread_id)] == ["refused"], thread_id


async def test_a_thread_id_its_subject_carries_but_the_service_does_not_allow_is_refused_once(service):
    # Each is a token NATS carries (no dot, no space, no wildcard) and no valid thread id.
    for thread_id in ("a/b", "x" * 129, "caf\u00e9"):
        await spawn(service, thread_id, environment=PERSONAL)
        refused = await hears(service, thread_id, "refused")
        assert refused["threadId"] == thread_id and refused["environmentId"] is None
        assert "threadId" in refused["reason"]
        assert_content_withheld(refused)
    await settled(service)
    for thread_id in ("a/b", "x" * 129, "caf\u00e9"):
        # Its `created` was refused, then its `message` (for no thread): each heard once.
        assert [o["status"] for o in await heard(service, thread_id)] == ["refused", "refused"], thread_id


async def test_a_service_killed_after_publishing_an_outcome_publishes_it_no_second_time(tmp_path: Path):
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_CRASH_AT="placement-published"))
    await service.start()
    try:
        await spawn(service, "t1", environment=PERSONAL)
        assert service.process is not None
        await asyncio.wait_for(asyncio.to_thread(service.process.wait), 60)  # it killed itself
        service.environment = service_environment(service.data_dir)
        await service.start()
        await hears(service, "t1", "ready")
        await spawn(service, "t2", environment=PERSONAL)
        await hears(service, "t2", "ready")
        await settled(service)
        for thread_id in ("t1", "t2"):
            assert [o["status"] for o in await heard(service, thread_id)] == ["ready"], thread_id
    finally:
        await service.stop()


@pytest.mark.parametrize("role", ["publisher", "subscriber"])
async def test_publishers_and_subscribers_may_read_state_and_change_nothing(service, role):
    await spawn(service, "t1", environment=PERSONAL)
    environment_id = (await hears(service, "t1", "ready"))["environmentId"]
    assert [o["status"] for o in await heard(service, "t1", role)] == ["ready"]
    nc, violations = await connect_as(service, role)
    try:

        async def ask(area: str, verb: str, **request: Any) -> dict[str, Any]:
            reply = await nc.request(subjects.api(area, verb), msgspec.json.encode(request), timeout=10)
            return json.loads(reply.data)

        assert [e["id"] for e in (await ask("environments", "list"))["environments"]] == [environment_id]
        assert (await ask("environments", "show", environmentId=environment_id))["status"] == "ready"
        assert "personal-workspace" in {p["id"] for p in (await ask("environments", "providers"))["providers"]}
        assert [t["id"] for t in (await ask("threads", "list"))["threads"]] == ["t1"]
        assert violations.seen == []
        for area, verb in (("environments", "delete"), ("environments", "retry"), ("threads", "spawn")):
            await nc.publish(subjects.api(area, verb), msgspec.json.encode({"environmentId": environment_id}))
            await violations.wait_for(f'publish to "{subjects.api(area, verb)}"')
    finally:
        await nc.close()
    assert (await service.show(environment_id))["status"] == "ready"


async def test_an_outcome_read_again_after_the_duplicate_window_is_not_published_again(tmp_path: Path):
    """A service or replica back after minutes away reads on from where it stopped, past the stream's
    duplicate window: what it hears again is looked up in the stream, not published twice, and an
    old outcome that a later one of the thread's has overtaken stays unpublished."""
    from datetime import datetime, timedelta
    from typing import cast

    import nats

    from bb_environments.bus.core.placements import Placements
    from bb_environments.bus.embedded_server import EmbeddedNats
    from bb_environments.bus.streams import ensure_streams
    from bb_environments.bus.wire.log_only_documents import ThreadRefusedDocument
    from bb_environments.handlers.store import Store

    server = EmbeddedNats.start(tmp_path / "nats")
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, 3600, 1 << 20)
        window_s = 0.5  # the service's is two minutes; its id is forgotten all the same once it passed
        config = (await js.stream_info(subjects.PLACEMENTS_STREAM)).config
        config.duplicate_window = window_s
        await js.update_stream(config)
        placements = Placements(js, cast(Store, None))  # refusals are announced without reading the store
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)

        def refusal(thread_id: str, version: int, at: datetime) -> ThreadRefusedDocument:
            return ThreadRefusedDocument(occurred_at=at, thread_id=thread_id, version=version, message="refused")

        async def stored(thread_id: str) -> list[str]:
            consumer = await js.pull_subscribe(
                subjects.placement(thread_id, "refused"), durable=thread_id, stream=subjects.PLACEMENTS_STREAM
            )
            pending = (await consumer.consumer_info()).num_pending  # nothing fetched yet: all it holds
            return (
                [message.headers["Nats-Msg-Id"] for message in await consumer.fetch(pending, timeout=5)]
                if pending
                else []
            )

        await placements.announce([refusal("t1", 2, an_hour_ago)])
        await asyncio.sleep(window_s * 2)  # past the window: the stream alone would take it again
        await placements.announce([refusal("t1", 2, an_hour_ago)])
        assert await stored("t1") == ["t1:-:refused:2"]

        # Overtaken: the thread's later outcome is stored after the old one was due.
        await placements.announce([refusal("t2", 5, datetime.now(UTC))])
        await placements.announce([refusal("t2", 2, an_hour_ago)])
        assert await stored("t2") == ["t2:-:refused:5"]

        # Never published before: an old outcome goes out once all the same.
        await placements.announce([refusal("t3", 2, an_hour_ago)])
        assert await stored("t3") == ["t3:-:refused:2"]
    finally:
        await nc.close()
        server.stop()
