"""A warm pool shared by two `bb serve` replicas on one PostgreSQL store (SPEC 10): each member is
bound to one thread, also when a replica is killed while threads bind."""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from bb_environments.bus.wire.api_messages import EnvironmentRef, Nothing, SetPool
from tests.replicas.test_replicas import (
    HOST,
    SETTLE_S,
    Topology,
    ask,
    environment_of,
    settled,
    spawn,
    stream_log,
    topology,  # noqa: F401 (the fixture)
)


async def pool_of(topology: Topology) -> dict[str, Any]:
    pools = (await ask(topology.replica("b"), "pools", "list", Nothing()))["pools"]
    assert len(pools) == 1
    return pools[0]


async def test_replicas_share_a_pool_and_a_replica_killed_while_threads_bind_binds_each_member_once(
    topology: Topology, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    (git_repo / ".bb-env-setup.sh").write_text(f'echo "$PWD" >> {marker}\n')
    subprocess.run(["git", "-C", str(git_repo), "add", ".bb-env-setup.sh"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(git_repo), "commit", "-qm", "setup"], check=True
    )
    a, b = topology.replica("a"), topology.replica("b")
    await ask(a, "pools", "set", SetPool(project_path=str(git_repo), provider_id="git-worktree", size=4, host_id=HOST))
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while (await pool_of(topology))["members"]["ready"] < 4:
        assert asyncio.get_running_loop().time() < deadline, f"the pool never filled: {await pool_of(topology)}"
        await asyncio.sleep(0.2)

    threads = await asyncio.gather(*(spawn(service, git_repo) for service in [a, b] * 3))
    a.kill()  # while members are bound and renamed, and their replacements prepared
    environments = [await environment_of(b, t) for t in threads]
    await settled(b, environments, "ready")
    assert len(set(environments)) == len(threads)

    logged = await stream_log(topology)
    bound = Counter(document["environmentId"] for _, document, _ in logged if document.get("type") == "bound")
    assert bound and all(count == 1 for count in bound.values()), bound
    setups = Counter(marker.read_text().splitlines())
    assert all(count == 1 for count in setups.values()), setups
    for environment_id in environments:
        shown = await ask(b, "environments", "show", EnvironmentRef(environment_id=environment_id))
        assert shown["path"] in setups
    # The replica left refills the pool.
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while (await pool_of(topology))["members"]["ready"] < 4:
        assert asyncio.get_running_loop().time() < deadline, "the replica left never refilled the pool"
        await asyncio.sleep(0.5)
