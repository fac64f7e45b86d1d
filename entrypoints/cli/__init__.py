"""The `bb` command line (SPEC §3). Every command takes --json; exit codes follow the SPEC:
0 success, 1 the operation failed, 2 invalid input, 3 not found, 4 service unreachable.

This module is the root group with its shared options, `bb serve`, and the Modal groups; each
other group has a module of its own (environment, thread, events, doctor). A command imports what only it
needs when it runs: every command pays for what is imported here.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from bb_environments.entrypoints.cli.console import console
from bb_environments.entrypoints.cli.doctor import doctor
from bb_environments.entrypoints.cli.environment import environment_group
from bb_environments.entrypoints.cli.events import events_group
from bb_environments.entrypoints.cli.pool import pool_group
from bb_environments.entrypoints.cli.support import LazyGroup, event_loop, fail, json_option, run_cli, stderr
from bb_environments.entrypoints.cli.thread import thread_group
from bb_environments.entrypoints.config import ConfigError, Settings


# -h is --help on every command: the context settings of the root group are every sub-command's.
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bb-environments", prog_name="bb", message="%(prog)s %(version)s")
@click.option("--data-dir", help="Service data directory (default $BB_DATA_DIR or ~/.local/share/bb).")
@click.option("--nats-url", help="Use this NATS instead of the embedded one (default $BB_NATS_URL).")
@click.pass_context
def cli(context: click.Context, data_dir: str | None, nats_url: str | None) -> None:
    """bb environments: isolated workspaces for agent threads."""
    try:
        context.obj = Settings.load(data_dir, nats_url)
    except ConfigError as bad:
        fail("invalid_input", str(bad), False)


@cli.command()
@click.option("--data-dir", help="Same as `bb --data-dir`, accepted here too.")
@click.option("--nats-url", help="Same as `bb --nats-url`, accepted here too.")
@click.option(
    "--nats-port",
    metavar="PORT",
    help="The embedded nats-server's port, from now on (default "
    "$BB_NATS_PORT, else the one the data dir remembers, else a free one chosen at first start).",
)
@click.option(
    "--no-agent",
    is_flag=True,
    help="Leave this host's work (its workspaces and hooks) to a "
    "`bb agent` of its own, instead of the agent that runs in this process.",
)
@click.option(
    "--replica-id",
    metavar="ID",
    help="Which replica this is among the `bb serve` sharing one "
    "PostgreSQL store and NATS (default $BB_REPLICA_ID, else the host id).",
)
@json_option
@click.pass_obj
def serve(
    settings: Settings,
    data_dir: str | None,
    nats_url: str | None,
    nats_port: str | None,
    no_agent: bool,
    replica_id: str | None,
    as_json: bool,
) -> None:
    """Run the service: embedded nats-server, event store, read models, host agent."""
    import logging

    from bb_environments.entrypoints.serve import ServeError
    from bb_environments.entrypoints.serve import serve as run_service

    try:
        if data_dir or nats_url or nats_port is not None or replica_id is not None:
            settings = Settings.load(
                data_dir or settings.data_root, nats_url or settings.nats_url, nats_port, replica_id
            )
    except ConfigError as bad:
        fail("invalid_input", str(bad), as_json)
    if settings.nats_url and settings.nats_port is not None:
        fail(
            "invalid_input",
            "--nats-port (BB_NATS_PORT) is the embedded nats-server's port: with --nats-url "
            "(BB_NATS_URL) there is none",
            as_json,
        )

    logging.basicConfig(
        level=os.environ.get("BB_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    def announce(info: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(info), flush=True)
        stderr.print(f"bb serving on {info['natsUrl']} (data dir {info['dataDir']})", markup=False)

    try:
        with event_loop() as loop:
            loop.run(run_service(settings, announce, agent_here=not no_agent))
    except ServeError as failed:
        fail("failed", str(failed), as_json)


@cli.command()
@click.option("--host-id", required=True, help="The registered host this agent works for (`bb machine register`).")
@click.option(
    "--credentials",
    required=True,
    type=click.Path(dir_okay=False),
    help="The seed file `bb machine register` wrote (mode 0600).",
)
@click.option(
    "--nats-url", help="The service's NATS (default $BB_NATS_URL, else the natsUrl of the local server.json)."
)
@click.option(
    "--root",
    help="Where this host's providers put the workspaces they own (default $BB_AGENT_ROOT, "
    "else <data dir>/hosts/<HOST_ID>).",
)
@click.pass_obj
def agent(settings: Settings, host_id: str, credentials: str, nats_url: str | None, root: str | None) -> None:
    """Run a host's agent in the foreground: it does that host's work, sharing only the bus with the core."""
    import logging
    from pathlib import Path

    import msgspec
    import nkeys

    from bb_environments.bus.access import check_host_id
    from bb_environments.entrypoints.agent import CredentialsRefused, agent_root, run_agent
    from bb_environments.entrypoints.cli.connection import embedded_server

    try:
        check_host_id(host_id)
    except ValueError as bad:
        fail("invalid_input", f"--host-id: {bad}", False)
    seed = Path(credentials)
    if not seed.is_file():
        fail(
            "invalid_input", f"--credentials {credentials}: no such file (the seed `bb machine register` wrote)", False
        )
    try:
        nkeys.from_seed(bytearray(seed.read_bytes().strip()))
    except (nkeys.NkeysError, ValueError, OSError):
        fail(
            "invalid_input",
            f"--credentials {credentials} holds no NKEY seed (the file `bb machine register` wrote, copied whole)",
            False,
        )
    url = nats_url or settings.nats_url
    if url is None:
        server = embedded_server(settings)
        assert server is not None  # without a NATS url of its own, the settings name the embedded server
        url = server.nats_url
    settings = msgspec.structs.replace(settings, host_id=host_id)
    logging.basicConfig(
        level=os.environ.get("BB_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        with event_loop() as loop:
            loop.run(run_agent(settings, seed, url, agent_root(settings, root)))
    except CredentialsRefused as refused:
        fail("failed", str(refused), False)
    except OSError as failed:
        fail("failed", f"bb agent failed: {failed}", False)


for commands in (environment_group, thread_group, events_group, pool_group, doctor, console):
    cli.add_command(commands)


# The Modal commands load the Modal provider, so they are imported only to run or list them
# (LazyGroup); the groups are declared here, so that `bb --help` lists them without that.
MODAL_COMMANDS = "bb_environments.entrypoints.cli.modal"


MACHINE_COMMANDS = "bb_environments.entrypoints.cli.machine"


@cli.group(
    "machine",
    cls=LazyGroup,
    lazy_subcommands={
        "create": f"{MODAL_COMMANDS}:machine_create",
        **{verb: f"{MACHINE_COMMANDS}:machine_{verb}" for verb in ("register", "list", "remove")},
    },
)
def machine_group() -> None:
    """The hosts whose agents do the work, and Modal sandboxes outside any environment."""


SECRET_COMMANDS = "bb_environments.entrypoints.cli.secret"


@cli.group(
    "secret",
    cls=LazyGroup,
    lazy_subcommands={verb: f"{SECRET_COMMANDS}:secret_{verb}" for verb in ("set", "list", "remove")},
)
def secret_group() -> None:
    """The secrets a project's setup and teardown hooks get, set from stdin (never shown again)."""


@cli.group(
    "modal", cls=LazyGroup, lazy_subcommands={group: f"{MODAL_COMMANDS}:{group}" for group in ("account", "image")}
)
def modal_group() -> None:
    """The Modal account and the image sandboxes start from."""


def main() -> None:
    run_cli(cli, sys.argv[1:])
