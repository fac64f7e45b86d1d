"""The lifecycle end to end through the CLI and NATS, against a real `bb serve`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import msgspec
import pytest

from bb_environments.bus.wire import subjects
from tests.integration.conftest import environment_events, eventually, lifecycle_types, write_hooks


def worktrees(repo) -> list[str]:
    listing = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout
    return [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("worktree ")]


async def spawn(service, repo, thread_id: str, *extra: str) -> dict:
    result = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(repo),
        "--thread-id",
        thread_id,
        "--wait",
        "--json",
        *extra,
    )
    assert result.returncode == 0, result.stderr
    return result.json()


async def test_spawn_ready_archive_removed_runs_each_hook_once_in_order(service, git_repo, tmp_path):
    marker = tmp_path / "hooks.log"
    write_hooks(git_repo, marker)

    spawned = await spawn(service, git_repo, "t1")
    assert spawned["status"] == "ready"
    shown = (await service.bb("environment", "show", spawned["environmentId"], "--json")).json()
    assert shown["status"] == "ready" and shown["ownsPath"] is True
    assert shown["hooks"]["setup"]["status"] == "succeeded"
    assert shown["path"] in worktrees(git_repo)
    assert "preparing the workspace" in shown["transcript"]

    archived = await service.bb("thread", "archive", "t1", "--json")
    assert archived.returncode == 0
    removed = await service.wait_for(spawned["environmentId"], "removed")

    assert removed["hooks"]["teardown"]["status"] == "succeeded"
    assert marker.read_text().split() == ["setup", "teardown"]
    assert worktrees(git_repo) == [str(git_repo)]
    assert "bb/t1" in subprocess.run(["git", "-C", str(git_repo), "branch"], capture_output=True, text=True).stdout

    types = lifecycle_types(await environment_events(service, spawned["environmentId"]))
    assert types == [
        "claimed",
        "created",
        "setup_started",
        "setup_succeeded",
        "ready",
        "thread_detached",
        "retire_scheduled",
        "removal_started",
        "teardown_started",
        "teardown_finished",
        "removed",
    ]


async def test_spawn_prompt_is_the_thread_first_message_on_the_bus(service, git_repo):
    await spawn(service, git_repo, "t1", "--prompt", "fix the flaky test")

    # Only the service reads BB_THREADS back; the agent's runner gets the message as it is published.
    listener = await service.connect("service")
    try:
        stored = await listener.jetstream().get_last_msg(
            subjects.THREADS_STREAM, subjects.thread_event("t1", "message")
        )
    finally:
        await listener.close()
    message = json.loads(stored.data)
    assert (message["type"], message["threadId"], message["text"]) == ("message", "t1", "fix the flaky test")
    assert message["occurredAt"]


async def test_event_versions_are_gap_free_per_environment(service, git_repo):
    spawned = await spawn(service, git_repo, "t1")
    await service.bb("thread", "archive", "t1")
    await service.wait_for(spawned["environmentId"], "removed")
    versions = [e["version"] for e in await environment_events(service, spawned["environmentId"])]
    assert versions == list(range(1, len(versions) + 1))


async def test_replay_rebuilds_read_models_equal_to_the_live_ones(service, git_repo):
    first = await spawn(service, git_repo, "t1")
    await spawn(service, git_repo, "t2")
    await service.bb("thread", "archive", "t1")
    await service.wait_for(first["environmentId"], "removed")
    await service.measured()  # t2's workspace measured: else its figure may come between the two lists
    before_envs = (await service.bb("environment", "list", "--json")).json()
    before_threads = (await service.bb("thread", "list", "--json")).json()

    replayed = await service.bb("events", "replay", "--json")

    assert replayed.returncode == 0
    counts = replayed.json()
    assert counts["environments"] == 2 and counts["threads"] == 2 and counts["events"] > 10
    assert (await service.bb("environment", "list", "--json")).json() == before_envs
    assert (await service.bb("thread", "list", "--json")).json() == before_threads


async def test_a_subscriber_hears_each_ready_once_even_when_the_relay_publishes_again(service, git_repo):
    heard: list[str] = []
    listener = await service.connect("subscriber")

    async def hear(message) -> None:
        heard.append(json.loads(message.data)["environmentId"])

    await listener.subscribe("bb.environments.*.ready", cb=hear)
    try:
        ids = [(await spawn(service, git_repo, f"t{i}"))["environmentId"] for i in range(3)]
        # A relay retry re-sends stored messages with the same Nats-Msg-Id: the stream drops them.
        relay = await service.connect("service")
        js = relay.jetstream()
        info = await js.stream_info(subjects.ENVIRONMENTS_STREAM)
        for sequence in range(1, info.state.last_seq + 1):
            stored = await js.get_msg(subjects.ENVIRONMENTS_STREAM, sequence)
            headers = {k: v for k, v in stored.headers.items() if k in ("Nats-Msg-Id", "Bb-Notification-Id")}
            ack = await js.publish(stored.subject, stored.data, headers=headers)
            assert ack.duplicate
        await listener.flush()
        deadline = time.monotonic() + 5
        while sorted(heard) != sorted(ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sorted(heard) == sorted(ids)
        await relay.close()
    finally:
        await listener.close()


async def test_a_service_publishing_raw_thread_events_gets_an_environment(service, git_repo):
    publisher = await service.connect("publisher")
    js = publisher.jetstream()
    ready = asyncio.get_running_loop().create_future()

    async def on_ready(message) -> None:
        if not ready.done():
            ready.set_result(json.loads(message.data))

    await publisher.subscribe("bb.environments.*.ready", cb=on_ready)
    try:
        created = {
            "type": "created",
            "occurredAt": "2026-11-30T12:00:00Z",
            "threadId": "raw1",
            "projectPath": str(git_repo),
            "environment": {
                "type": "provider",
                "environmentProviderId": "git-worktree",
                "machine": {"type": "existing", "hostId": "local"},
                "inputs": {"branch": {"kind": "new", "name": "feature/raw"}},
            },
        }
        await js.publish(subjects.thread_event("raw1", "created"), msgspec.json.encode(created))
        await js.publish(
            subjects.thread_event("raw1", "message"),
            b'{"type": "message", "occurredAt": "2026-11-30T12:00:01Z", "threadId": "raw1"}',
        )
        event = await asyncio.wait_for(ready, 30)
        assert event["threadIds"] == ["raw1"] and event["status"] == "ready"
        branch = subprocess.run(
            ["git", "-C", event["path"], "branch", "--show-current"], capture_output=True, text=True
        ).stdout.strip()
        assert branch == "feature/raw"

        await js.publish(
            subjects.thread_event("raw1", "archived"),
            b'{"type": "archived", "occurredAt": "2026-11-30T12:00:02Z", "threadId": "raw1"}',
        )
        await service.wait_for(event["environmentId"], "removed")
    finally:
        await publisher.close()


async def test_setup_failure_is_an_error_and_retry_reruns_setup_in_the_same_workspace(service, git_repo, tmp_path):
    marker = tmp_path / "hooks.log"
    gate = tmp_path / "allow-setup"
    write_hooks(git_repo, marker, setup=f"test -e {gate} || exit 3")

    failed = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "t1",
        "--wait",
        "--json",
    )
    assert failed.returncode == 1
    document = failed.json()
    assert document["status"] == "error" and "exit code 3" in document["statusMessage"]
    path = (await service.show(document["environmentId"]))["path"]

    gate.touch()
    retried = await service.bb("environment", "retry", document["environmentId"], "--json")
    assert retried.returncode == 0
    ready = await service.wait_for(document["environmentId"], "ready")
    assert ready["path"] == path
    assert marker.read_text().split() == ["setup", "setup"]


async def test_threads_share_an_environment_which_retires_after_the_last_leaves(service, git_repo):
    first = await spawn(service, git_repo, "t1")
    joined = await service.bb("thread", "spawn", "--environment", first["environmentId"], "--thread-id", "t2", "--json")
    assert joined.returncode == 0 and joined.json()["environmentId"] == first["environmentId"]
    listed = (await service.bb("thread", "list", "--environment", first["environmentId"], "--json")).json()
    assert sorted(t["id"] for t in listed["threads"]) == ["t1", "t2"]

    await service.bb("thread", "archive", "t1")
    still = await service.wait_for(first["environmentId"], lambda e: e["threadIds"] == ["t2"])
    assert still["status"] == "ready"

    refused = await service.bb("environment", "delete", first["environmentId"], "--json")
    assert refused.returncode == 1 and "t2" in refused.json()["error"]["message"]

    await service.bb("thread", "archive", "t2")
    await service.wait_for(first["environmentId"], "removed")


async def test_delete_removes_an_environment_that_never_retires_by_itself(tmp_path, git_repo):
    from tests.integration.conftest import Service, service_environment

    data = tmp_path / "data"
    service = Service(data, service_environment(data, BB_RETIRE_GRACE_MS="null"))
    await service.start()
    try:
        spawned = await spawn(service, git_repo, "t1")
        await service.bb("thread", "archive", "t1")
        kept = await service.wait_for(spawned["environmentId"], lambda e: e["threadIds"] == [])
        assert kept["status"] == "ready"
        deleted = await service.bb("environment", "delete", spawned["environmentId"], "--json")
        assert deleted.returncode == 0
        await service.wait_for(spawned["environmentId"], "removed")
        assert worktrees(git_repo) == [str(git_repo)]
    finally:
        await service.stop()


async def test_delete_removes_a_retiring_environment_now_instead_of_after_the_grace(tmp_path, git_repo):
    from tests.integration.conftest import Service, service_environment

    data = tmp_path / "data"
    service = Service(data, service_environment(data, BB_RETIRE_GRACE_MS="600000"))
    await service.start()
    try:
        spawned = await spawn(service, git_repo, "t1")
        await service.bb("thread", "archive", "t1")
        retiring = await service.wait_for(spawned["environmentId"], "retiring")
        assert retiring["threadIds"] == []
        deleted = await service.bb("environment", "delete", spawned["environmentId"], "--json")
        assert deleted.returncode == 0, deleted.stderr
        await service.wait_for(spawned["environmentId"], "removed", timeout=30)  # not 600 s
        assert worktrees(git_repo) == [str(git_repo)]
    finally:
        await service.stop()


async def test_thread_events_delivered_twice_or_late_have_no_effect(service, git_repo):
    publisher = await service.connect("publisher")
    js = publisher.jetstream()

    async def publish(kind: str, **extra) -> None:
        body = {"type": kind, "occurredAt": "2026-11-30T12:00:00Z", "threadId": "dup", **extra}
        await js.publish(subjects.thread_event("dup", kind), msgspec.json.encode(body))

    intent = {"type": "provider", "environmentProviderId": "git-worktree", "inputs": None}
    try:
        for _ in range(2):
            await publish("created", projectPath=str(git_repo), environment=intent)
        for _ in range(2):
            await publish("message")
        threads = await service.wait_for_thread("dup", having="environmentId")
        environment_id = threads["environmentId"]
        ready = await service.wait_for(environment_id, "ready")
        for _ in range(2):
            await publish("archived")
        await service.wait_for(environment_id, "removed")
        await publish("message")  # late: the thread is archived
        await publish("created", projectPath=str(git_repo), environment=intent)  # late and repeated
        await publish("archived")
        await service.thread_events_handled()
        replies = (await service.bb("environment", "list", "--all", "--json")).json()["environments"]
        assert [e["id"] for e in replies] == [environment_id]
        events = await environment_events(service, environment_id)
        assert [e["type"] for e in events].count("claimed") == 1
        assert [e["version"] for e in events] == list(range(1, len(events) + 1))
        # Once each, whatever was delivered twice; the host found no setup script in the worktree.
        assert [e["type"] for e in events[: ready["version"]]] == [
            "claimed",
            "created",
            "setup_started",
            "setup_skipped",
            "ready",
        ]
        assert events[-1]["type"] == "removed"
    finally:
        await publisher.close()


async def test_twenty_threads_published_at_once_all_become_ready_each_in_its_own_order(service, git_repo):
    """Thread events are handled one at a time, each as soon as it arrives (not on a fetch
    timeout): twenty threads sent together all get their environment, and each thread's
    `created`, `message` and `archived` take effect in the order it sent them."""
    publisher = await service.connect("publisher")
    js = publisher.jetstream()
    intent = {"type": "provider", "environmentProviderId": "git-worktree"}
    thread_ids = [f"many{i}" for i in range(20)]

    async def publish(thread_id: str, kind: str, **extra) -> None:
        body = {"type": kind, "threadId": thread_id, **extra}
        await js.publish(subjects.thread_event(thread_id, kind), msgspec.json.encode(body))

    async def send_thread(thread_id: str) -> None:
        # A message before its thread's `created` would be refused: no environment would come.
        await publish(thread_id, "created", projectPath=str(git_repo), environment=intent)
        await publish(thread_id, "message")

    try:
        await asyncio.gather(*(send_thread(t) for t in thread_ids))
        threads = [await service.wait_for_thread(t, having="environmentId", timeout=120) for t in thread_ids]
        environment_ids = [t["environmentId"] for t in threads]
        assert len(set(environment_ids)) == 20
        for environment_id in environment_ids:
            await service.wait_for(environment_id, "ready", timeout=120)
        await asyncio.gather(*(publish(t, "archived") for t in thread_ids))
        for environment_id in environment_ids:
            await service.wait_for(environment_id, "removed", timeout=120)
            events = await environment_events(service, environment_id)
            assert [e["version"] for e in events] == list(range(1, len(events) + 1))
            types = [e["type"] for e in events]
            assert types[0] == "claimed" and types.count("ready") == 1 and types[-1] == "removed"
            assert types.index("ready") < types.index("removed")
    finally:
        await publisher.close()


async def test_a_failing_teardown_is_recorded_and_removal_proceeds(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "hooks.log", teardown="echo cannot tear down >&2; exit 4")
    spawned = await spawn(service, git_repo, "t1")
    await service.bb("thread", "archive", "t1")
    removed = await service.wait_for(spawned["environmentId"], "removed")
    assert removed["hooks"]["teardown"]["status"] == "failed"
    assert "cannot tear down" in removed["transcript"]
    assert worktrees(git_repo) == [str(git_repo)]


async def test_list_hides_removed_environments_unless_asked_for(service, git_repo):
    gone = await spawn(service, git_repo, "t1")
    kept = await spawn(service, git_repo, "t2")
    await service.bb("thread", "archive", "t1")
    await service.wait_for(gone["environmentId"], "removed")

    async def listed(*options: str) -> set[str]:
        result = await service.bb("environment", "list", "--json", *options)
        assert result.returncode == 0, result.stderr
        return {e["id"] for e in result.json()["environments"]}

    assert await listed() == {kept["environmentId"]}
    assert await listed("--all") == {gone["environmentId"], kept["environmentId"]}
    assert await listed("--status", "removed") == {gone["environmentId"]}
    refused = await service.bb("environment", "list", "--status", "gone", "--json")
    assert refused.returncode == 2 and "removed" in refused.json()["error"]["message"]


@pytest.mark.parametrize("service", [{"BB_REMOVED_RETENTION_S": "0.001"}], indirect=True)
async def test_a_removed_environment_s_hook_records_and_transcript_are_dropped_and_a_live_one_s_kept(
    service, git_repo, tmp_path
):
    write_hooks(git_repo, tmp_path / "hooks.log")
    removed = await spawn(service, git_repo, "t1")
    live = await spawn(service, git_repo, "t2")
    records = service.data_dir / "hooks"
    assert len(list(records.rglob("*.json"))) == 2  # the two setups

    assert (await service.bb("thread", "archive", "t1", "--json")).returncode == 0
    await service.wait_for(removed["environmentId"], "removed")

    # The sweep deletes t1's setup and teardown records and logs, and keeps t2's.
    def files() -> list:
        return [path for path in records.rglob("*") if path.is_file()]

    await eventually(lambda: len(files()) == 2, "the deletion of the removed environment's records")
    assert sorted(p.suffix for p in files()) == [".json", ".log"]
    shown = (await service.bb("environment", "show", live["environmentId"], "--json")).json()
    assert shown["status"] == "ready" and shown["hooks"]["setup"]["status"] == "succeeded"
    assert shown["transcript"]

    # Its transcript goes from the stream and from the read model; the live one's stays.
    async def transcript_of(environment_id: str) -> list[str]:
        return (await service.bb("environment", "show", environment_id, "--json")).json()["transcript"]

    nc = await service.connect("service")
    try:
        js = nc.jetstream()

        async def streamed(environment_id: str) -> int:
            info = await js.stream_info(
                subjects.TRANSCRIPTS_STREAM, subjects_filter=subjects.transcript(environment_id)
            )
            return sum((info.state.subjects or {}).values())

        deadline = time.monotonic() + 30
        while await transcript_of(removed["environmentId"]):
            assert time.monotonic() < deadline, "the removed environment's transcript was never dropped"
            await asyncio.sleep(0.1)
        assert await streamed(removed["environmentId"]) == 0
        assert await streamed(live["environmentId"]) > 0
    finally:
        await nc.close()
    assert await transcript_of(live["environmentId"])
