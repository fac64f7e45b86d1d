"""The documented deployment (SPEC 7.2, v4): replicas with --no-agent and a `bb agent` per host.
Every read command answers through them, and a replica's own host, which no agent serves, is no
machine: not listed, not surveyed, and no spawn goes there."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import Result
from tests.replicas.test_replicas import HOST, Topology, topology  # noqa: F401 (the fixture)

INSTALLED = {"git-worktree", "modal-sandbox", "personal-workspace", "project-checkout"}


async def bb(topology: Topology, *args: str) -> Result:
    """A `bb` command as an operator runs it against the deployment: its NATS and the operator's seed."""
    a = topology.replica("a")
    original = a.environment
    a.environment = {**original, "BB_NATS_NKEY": str(topology.cluster.seed_file("operator"))}
    try:
        return await a.bb(*args, timeout=60)
    finally:
        a.environment = original


def answered(result: Result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_every_read_command_answers_and_the_replicas_own_hosts_are_no_machines(topology: Topology) -> None:
    providers = answered(await bb(topology, "environment", "providers", "--json"))["providers"]
    assert INSTALLED <= {p["id"] for p in providers}
    for provider in providers:  # no default host: the answering replica's own, whose agent is not there to say
        assert provider["availability"]["status"] == "blocked"
        assert "waiting for the agent of host 'core-" in provider["availability"]["reason"], provider

    machines = answered(await bb(topology, "machine", "list", "--json"))["machines"]
    assert [(m["id"], m["status"]) for m in machines] == [(HOST, "online")]
    assert answered(await bb(topology, "thread", "list", "--json")) == {"threads": []}
    assert answered(await bb(topology, "environment", "list", "--json")) == {"environments": []}
    assert answered(await bb(topology, "doctor", "--json")) == {"orphans": [], "missing": []}

    refused = await bb(topology, "thread", "spawn", "--environment-provider", "personal-workspace", "--json")
    assert refused.returncode == 2, refused.stderr
    assert "names no host" in refused.stderr and f"the hosts are: {HOST}" in refused.stderr
    assert answered(await bb(topology, "thread", "list", "--json")) == {"threads": []}  # nothing was recorded


@pytest.mark.parametrize("topology", [{"everywhere": {"BB_DEFAULT_HOST": HOST}}], indirect=True, ids=["default-host"])
async def test_a_spawn_that_names_no_host_goes_to_the_default_host(topology: Topology) -> None:
    providers = answered(await bb(topology, "environment", "providers", "--json"))["providers"]
    assert {p["id"]: p["availability"]["status"] for p in providers}["personal-workspace"] == "ready"

    spawned = answered(
        await bb(topology, "thread", "spawn", "--environment-provider", "personal-workspace", "--wait", "--json")
    )
    assert spawned["status"] == "ready"
    shown = answered(await bb(topology, "environment", "show", spawned["environmentId"], "--json"))
    assert shown["hostId"] == HOST
    machines = answered(await bb(topology, "machine", "list", "--json"))["machines"]
    assert [(m["id"], m["environments"]) for m in machines] == [(HOST, 1)]
