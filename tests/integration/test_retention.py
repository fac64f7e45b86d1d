"""Bounded growth (SPEC 9): past BB_REMOVED_RETENTION_S a removed environment leaves no file, no
read-model row, no message in BB_ENVIRONMENTS and no placement outcome of its threads, while the event store still answers `show`,
`history` and `export` for it; a restart, even with the read models lost, publishes nothing again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from bb_environments.bus.wire import subjects
from bb_environments.domain.path_claim import claim_id
from tests.integration.conftest import eventually, write_hooks

RETAINED = {"BB_REMOVED_RETENTION_S": "1"}


def files_under(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()]


async def spawned(service, *args: str) -> str:
    result = await service.bb("thread", "spawn", *args, "--wait", "--json")
    assert result.returncode == 0, result.stderr
    return result.json()["environmentId"]


async def listed_all(service) -> set[str]:
    result = await service.bb("environment", "list", "--all", "--json")
    assert result.returncode == 0, result.stderr
    return {environment["id"] for environment in result.json()["environments"]}


async def stored_messages(service, *filters: str, stream: str = subjects.ENVIRONMENTS_STREAM) -> int:
    """How many messages `stream` holds on these subjects."""
    nc = await service.connect("service")
    try:
        js = nc.jetstream()
        total = 0
        for subject_filter in filters:
            info = await js.stream_info(stream, subjects_filter=subject_filter)
            total += sum((info.state.subjects or {}).values())
        return total
    finally:
        await nc.close()


async def forgotten(service, environment_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while environment_id in await listed_all(service):
        assert asyncio.get_running_loop().time() < deadline, "the removed environment was never forgotten"
        await asyncio.sleep(0.2)


def subjects_of(environment: dict, thread_id: str) -> list[str]:
    claims = {
        claim_id(environment["hostId"], path) for path in (environment["claimedPath"], environment["path"]) if path
    }
    return [
        f"bb.log.environment.{environment['id']}.>",
        f"bb.log.thread.{thread_id}.>",
        *(f"bb.log.claim.{claim}.>" for claim in claims),
    ]


@pytest.mark.parametrize("service", [RETAINED], indirect=True)
async def test_past_retention_a_removed_environment_leaves_no_file_row_or_message_and_the_log_still_answers(
    service, git_repo, tmp_path
):
    write_hooks(git_repo, tmp_path / "hooks.log")
    gone = await spawned(
        service, "--environment-provider", "git-worktree", "--project", str(git_repo), "--thread-id", "t1"
    )
    workspace = Path((await service.show(gone))["path"])
    assert (await service.bb("thread", "archive", "t1", "--wait", "--json")).returncode == 0
    removed = await service.show(gone)
    # Another environment after it: the stream's last message is never purged (see bus/core/retention.py).
    kept = await spawned(
        service, "--environment-provider", "git-worktree", "--project", str(git_repo), "--thread-id", "t2"
    )

    await forgotten(service, gone)

    assert await listed_all(service) == {kept}
    assert await stored_messages(service, *subjects_of(removed, "t1")) == 0
    assert await stored_messages(service, f"bb.log.environment.{kept}.>") > 0
    placements = subjects.PLACEMENTS_STREAM
    assert await stored_messages(service, "bb.placements.t1.>", stream=placements) == 0
    assert await stored_messages(service, "bb.placements.t2.>", stream=placements) == 1
    hooks = service.data_dir / "hooks"
    await eventually(lambda: len(files_under(hooks)) == 2, "the deletion of the removed environment's hook records")
    assert not workspace.exists()
    threads = (await service.bb("thread", "list", "--json")).json()["threads"]
    assert [thread["id"] for thread in threads] == ["t2"]

    # The event store still answers for it.
    shown = await service.bb("environment", "show", gone, "--json")
    assert shown.returncode == 0, shown.stderr
    assert {k: v for k, v in shown.json().items() if k != "transcript"} == {
        k: v for k, v in removed.items() if k != "transcript"
    }
    history = await service.bb("environment", "history", gone, "--json")
    assert history.returncode == 0, history.stderr
    assert [e["version"] for e in history.json()["events"]] == list(range(1, removed["version"] + 1))
    await service.measured()  # the log quiet, so that the export and the store's are of one log
    while_serving = await service.bb("events", "export")
    assert while_serving.returncode == 0, while_serving.stderr
    exported = [json.loads(line) for line in while_serving.stdout.splitlines()]
    assert [e["version"] for e in exported if e.get("environmentId") == gone and "threadIds" in e] == list(
        range(1, removed["version"] + 1)
    )
    await service.stop()
    from_store = await service.bb("events", "export")
    assert from_store.stdout == while_serving.stdout  # the same log, byte for byte, in order


@pytest.mark.parametrize("service", [RETAINED], indirect=True)
async def test_a_restart_with_its_read_models_lost_after_a_purge_reads_the_store_and_publishes_nothing_again(
    service, tmp_path
):
    gone = await spawned(service, "--environment-provider", "personal-workspace", "--thread-id", "t1")
    assert (await service.bb("thread", "archive", "t1", "--wait", "--json")).returncode == 0
    # Its end is the stream's last message: a pass purges its thread's messages, and keeps that one.
    deadline = asyncio.get_running_loop().time() + 60
    while await stored_messages(service, "bb.log.thread.t1.>"):
        assert asyncio.get_running_loop().time() < deadline, "the removed environment's thread was never purged"
        await asyncio.sleep(0.2)
    assert await stored_messages(service, f"bb.log.environment.{gone}.>") > 0
    held_before, logged_before = await held_notifications(service), await logged(service)
    await service.stop()
    for suffix in ("", "-wal", "-shm"):
        (service.data_dir / f"read-models.sqlite{suffix}").unlink(missing_ok=True)

    await service.start()
    kept = await spawned(service, "--environment-provider", "personal-workspace", "--thread-id", "t2")
    await forgotten(service, gone)  # rebuilt from the store, then forgotten once its end is not the last

    assert await listed_all(service) == {kept}
    await service.measured()  # t2's last event (its disk figure, a moment after ready) on the stream
    # The stream gained the events logged since (t2's spawn) and nothing else: the relay went on
    # from its last message, not from what the purge left before it.
    held_after = await held_notifications(service)
    assert len(held_after) == len(set(held_after))
    assert {n for n in held_after if n > logged_before} == set(range(logged_before + 1, await logged(service) + 1))
    assert {n for n in held_after if n <= logged_before} <= set(held_before)
    assert await stored_messages(service, f"bb.log.environment.{gone}.>", "bb.log.thread.t1.>") == 0
    shown = await service.bb("environment", "show", gone, "--json")
    assert shown.returncode == 0 and shown.json()["status"] == "removed", shown.stderr


async def held_notifications(service) -> list[int]:
    """The notification ids of the messages BB_ENVIRONMENTS holds, in stream order."""
    nc = await service.connect("service")
    try:
        js = nc.jetstream()
        state = (await js.stream_info(subjects.ENVIRONMENTS_STREAM)).state
        held = []
        for sequence in range(state.first_seq, state.last_seq + 1):
            try:
                message = await js.get_msg(subjects.ENVIRONMENTS_STREAM, sequence)
            except NotFoundError:
                continue
            held.append(subjects.claimed_notification_id(message.headers))
        return held
    finally:
        await nc.close()


async def logged(service) -> int:
    """How many events the log holds (export fills in what the stream no longer has from the store)."""
    exported = await service.bb("events", "export")
    assert exported.returncode == 0, exported.stderr
    return len(exported.stdout.splitlines())


async def test_environments_whose_hooks_never_ran_leave_no_hook_record(service):
    for thread_id in ("t1", "t2"):
        environment_id = await spawned(
            service, "--environment-provider", "personal-workspace", "--thread-id", thread_id
        )
        assert (await service.bb("thread", "archive", thread_id, "--wait", "--json")).returncode == 0
        shown = await service.show(environment_id)
        assert shown["status"] == "removed" and shown["hooks"]["teardown"]["status"] == "skipped"

    assert files_under(service.data_dir / "hooks") == []
