"""`bb machine register|list|remove`: the hosts whose agents do the work where the workspaces live
(SPEC 7.1), through the service; `list` adds the Modal machines when Modal credentials are set
(`bb machine create` and the removal of a Modal machine are entrypoints/cli/modal.py's)."""

from __future__ import annotations

import os
import shlex
from typing import Any

import click

from bb_environments.bus.wire.api_messages import HostRef, Nothing, RegisterHost
from bb_environments.entrypoints.cli.connection import call, embedded_server
from bb_environments.entrypoints.cli.support import Failure, emit, json_option, print_table, run_command, stderr, stdout
from bb_environments.entrypoints.config import Settings


@click.command("register")
@click.argument("host_id")
@click.option(
    "--rotate",
    is_flag=True,
    help="Replace the credentials of a registered host; its agent is "
    "disconnected at once and must start again with the new file.",
)
@json_option
@click.pass_obj
@run_command
def machine_register(settings: Settings, host_id: str, rotate: bool, as_json: bool) -> None:
    """Register a host and write the credentials its agent connects with."""
    registered = call(settings, "machines", "register", RegisterHost(host_id=host_id, rotate=rotate), changes=True)
    command = ["bb", "agent", "--host-id", registered["hostId"], "--credentials", registered["credentials"]]
    if (server := embedded_server(settings)) is not None:
        command += ["--nats-url", server.nats_url]
    document = {**registered, "command": shlex.join(command)}

    def human(d: dict[str, Any]) -> None:
        stdout.print(f"host {d['hostId']} registered; its agent's credentials: {d['credentials']}", markup=False)
        stdout.print(f"on that machine, with the file copied there: {d['command']}", markup=False)

    emit(document, as_json, human)


@click.command("list")
@json_option
@click.pass_obj
@run_command
def machine_list(settings: Settings, as_json: bool) -> None:
    """List every machine: this service's host, each registered host, each Modal machine."""
    machines = call(settings, "machines", "list", Nothing())["machines"]
    machines += _modal_machines(settings)

    def human(d: dict[str, Any]) -> None:
        print_table(
            ["ID", "KIND", "STATUS", "LAST SEEN", "ENVIRONMENTS"],
            [
                [
                    m["id"] + (" (this service)" if m.get("own") else ""),
                    m["kind"],
                    m["status"],
                    m.get("lastSeenAt") or "-",
                    str(m.get("environments", 0)),
                ]
                for m in d["machines"]
            ],
        )

    emit({"machines": machines}, as_json, human)


@click.command("remove")
@click.argument("machine_id")
@click.option(
    "--yes",
    is_flag=True,
    help="Confirm: a host's credentials stop working at once; a Modal machine is terminated and its files are lost.",
)
@json_option
@click.pass_obj
@run_command
def machine_remove(settings: Settings, machine_id: str, yes: bool, as_json: bool) -> None:
    """Remove a registered host (refused while it holds environments), or terminate a Modal machine."""
    if not yes:
        raise Failure("invalid_input", f"removing {machine_id} cannot be undone: pass --yes to confirm")
    if machine_id.startswith("sb-"):  # Modal's sandbox ids; a host id never needs that start
        from bb_environments.entrypoints.cli.modal import remove_modal_machine

        document = remove_modal_machine(machine_id)
    else:
        document = call(settings, "machines", "remove", HostRef(host_id=machine_id), changes=True)
        document = {"machineId": document["hostId"], "status": document["status"]}
    emit(document, as_json, lambda d: stdout.print(f"{d['machineId']}  removed", markup=False))


def _modal_machines(settings: Settings) -> list[dict[str, Any]]:
    """The Modal machines, when this process has Modal credentials; without them there are none to list."""
    if not os.environ.get("MODAL_TOKEN_ID"):
        return []
    from bb_environments.entrypoints.cli.modal import list_modal_machines

    try:
        listed = list_modal_machines(settings)
    except Failure as failed:
        stderr.print(f"bb: the Modal machines are left out: {failed.message}", markup=False)
        return []
    return [
        {"id": m["id"], "kind": "modal-sandbox", "status": "online", "lastSeenAt": None, "environments": 0, **m}
        for m in listed
    ]
