"""A project's secrets (SPEC 11) through either of two replicas, each keeping the values in its own
data dir: a secret set through one reaches a hook whose question another answers, a replica
started after the set fetches it, and a removal through one reaches the others. No value is in
any stream's message."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from bb_environments.bus.wire.api_messages import SecretRef, SetSecret, SpawnThread
from tests.integration.conftest import eventually, write_hooks
from tests.integration.test_project_secrets import files_holding, messages_stored
from tests.replicas.test_replicas import HOST, SETTLE_S, Topology, ask, environment_of, topology  # noqa: F401 (the fixture)


async def spawned_ready(topology: Topology, replica_id: str, repo: Path) -> dict:
    """The environment of a new thread once ready and its setup's line is in its transcript: the
    host's lines reach the transcript through the core's intake, a moment after the log's `ready`
    when the replica that held the intake has just stopped."""
    service = topology.replica(replica_id)
    thread_id = f"t-{uuid.uuid4().hex[:16]}"
    request = SpawnThread(
        thread_id=thread_id, environment_provider="git-worktree", project_path=str(repo), host_id=HOST
    )
    await ask(service, "threads", "spawn", request)
    return await service.wait_for(
        await environment_of(service, thread_id),
        lambda e: e["status"] == "ready" and "token length" in json.dumps(e["transcript"]),
        timeout=SETTLE_S,
    )


async def test_a_secret_set_through_one_replica_reaches_hooks_through_the_others_and_its_removal_too(
    topology: Topology, git_repo: Path, tmp_path: Path
) -> None:
    write_hooks(git_repo, tmp_path / "hooks.log", setup='printf "token length %s\\n" "${#API_TOKEN}"')
    value = f"tok-{uuid.uuid4().hex}"
    await ask(
        topology.replica("a"), "secrets", "set", SetSecret(project_path=str(git_repo), name="API_TOKEN", value=value)
    )
    await eventually(lambda: files_holding(topology.base / "b", value) != [], "b told the value", timeout=SETTLE_S)

    await topology.start_replica("c")  # away at the set: it fetches the value at start-up
    await eventually(lambda: files_holding(topology.base / "c", value) != [], "c fetched the value", timeout=SETTLE_S)

    await topology.replica("a").stop()  # b and c answer the agent: each has the value
    ready = await spawned_ready(topology, "b", git_repo)
    assert f"token length {len(value)}" in json.dumps(ready["transcript"])

    await ask(topology.replica("b"), "secrets", "remove", SecretRef(project_path=str(git_repo), name="API_TOKEN"))
    await eventually(lambda: files_holding(topology.base / "c", value) == [], "c told of the removal", timeout=SETTLE_S)
    assert files_holding(topology.base / "b", value) == []
    ready = await spawned_ready(topology, "c", git_repo)
    assert "token length 0" in json.dumps(ready["transcript"])
    assert all(value.encode() not in message for message in await messages_stored(await topology.service_connection()))
    assert files_holding(topology.base / HOST, value) == []
