"""`bb pool set|list|resume`: warm pools of environments set up ahead of their threads (SPEC 10,
docs/pools.md), through the service."""

from __future__ import annotations

import os
from typing import Any

import click

from bb_environments.bus.wire.api_messages import Nothing, PoolRef, SetPool
from bb_environments.entrypoints.cli.connection import call
from bb_environments.entrypoints.cli.support import Failure, emit, fitted, json_option, print_table, run_command, stdout
from bb_environments.entrypoints.cli.thread import parse_inputs
from bb_environments.entrypoints.config import Settings


@click.group("pool")
def pool_group() -> None:
    """Warm pools: environments created and set up ahead, bound to a thread's first message."""


@pool_group.command("set")
@click.option("--project", required=True, help="The project its members are of: an absolute path on the host.")
@click.option("--provider", "provider_id", required=True, help="The provider of its members (one that can pool).")
@click.option("--size", required=True, help="How many ready members to keep: 0 or more (0 drains the pool).")
@click.option("--host", "host_id", help="The host its members live on (default: where a spawn goes).")
@click.option("--inputs", "inputs_text", help="The provider's inputs as JSON, as a thread would ask for them.")
@json_option
@click.pass_obj
@run_command
def pool_set(
    settings: Settings,
    project: str,
    provider_id: str,
    size: str,
    host_id: str | None,
    inputs_text: str | None,
    as_json: bool,
) -> None:
    """Keep SIZE environments ready for threads that ask for this project, provider and inputs."""
    if not (size.isascii() and size.isdigit()):
        raise Failure(
            "invalid_input", f"--size {size!r} is not allowed: use a whole number, 0 or more (0 drains the pool)"
        )
    request = SetPool(
        project_path=os.path.abspath(project),
        provider_id=provider_id,
        size=int(size),
        host_id=host_id,
        inputs=parse_inputs(inputs_text, "--inputs"),
    )
    emit(call(settings, "pools", "set", request, changes=True), as_json, lambda d: _table([d]))


@pool_group.command("list")
@json_option
@click.pass_obj
@run_command
def pool_list(settings: Settings, as_json: bool) -> None:
    """List the pools with their members and whether they are paused."""
    emit(call(settings, "pools", "list", Nothing()), as_json, lambda d: _table(d["pools"]))


@pool_group.command("resume")
@click.argument("pool_id")
@json_option
@click.pass_obj
@run_command
def pool_resume(settings: Settings, pool_id: str, as_json: bool) -> None:
    """Lift a pool's pause (after its member setups kept failing): it prepares members again."""
    emit(call(settings, "pools", "resume", PoolRef(pool_id=pool_id), changes=True), as_json, lambda d: _table([d]))


def _table(pools: list[dict[str, Any]]) -> None:
    if not pools:
        stdout.print("no pools (`bb pool set` keeps one)", markup=False)
        return
    # A whole id (`resume` takes it), the project and the members fit 80 columns; the host and the
    # provider are in --json.
    print_table(
        ["ID", "PROJECT", "READY", "BASE", "STATE"],
        [
            [
                p["id"],
                p["projectPath"] or "-",
                f"{p['members']['ready']}/{p['size']}",
                (p["baseCommit"] or "-")[:7],
                _state(p),
            ]
            for p in pools
        ],
        shrink={"PROJECT": "end"},
    )
    for pool in pools:  # a reason is a sentence: under the table, whole
        if pool["paused"]:
            print(fitted(f"pool {pool['id']} paused: ", pool["paused"]["reason"], indent=2))


def _state(pool: dict[str, Any]) -> str:
    """Paused (why is under the table), else what its members are doing besides waiting ready."""
    if pool["paused"]:
        return "paused"
    members = pool["members"]
    doing = [f"{members[kind]} {kind}" for kind in ("preparing", "stale") if members[kind]]
    return ", ".join(doing) or "-"
