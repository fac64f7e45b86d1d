"""`bb console`: the operator's read-only web page of the fleet and each environment (SPEC §12),
served until interrupted. The web server is imported only when it runs (entrypoints/console/)."""

from __future__ import annotations

import json
import sys

import click

from bb_environments.entrypoints.cli.support import Failure, json_option, run_command, stderr, stdout
from bb_environments.entrypoints.config import Settings


@click.command("console")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The port to serve on; 0 lets the system choose a free one (printed).",
)
@click.option(
    "--bind",
    metavar="ADDR",
    default="127.0.0.1",
    show_default=True,
    help="The address to serve on; another than this machine's loopback lets the network reach the page "
    "(plain HTTP: the token is all that guards it).",
)
@json_option
@click.pass_obj
@run_command
async def console(settings: Settings, port: int, bind: str, as_json: bool) -> None:
    """Serve a read-only web page of the fleet and each environment's life, live, until interrupted.

    Prints its address with a token (as Jupyter does); without the token every page answers 401."""
    from bb_environments.entrypoints.console.server import is_loopback, serve

    def announce(address: str, listening: int) -> None:
        if as_json:
            print(json.dumps({"url": address, "bind": bind, "port": listening}), flush=True)
        else:
            stdout.print(f"bb console (read-only) at {address}", markup=False)
            stdout.print("open it in a browser; Ctrl-C stops it", markup=False)
            sys.stdout.flush()  # a reader of a pipe (a test, a script) learns the address now
        if not is_loopback(bind):
            stderr.print(f"bb: the console is reachable from the network on {bind}, over plain HTTP", markup=False)

    try:
        await serve(settings, port, bind, announce)
    except OSError as unusable:
        raise Failure(
            "failed", f"cannot serve the console on {bind} port {port}: {unusable.strerror or unusable}"
        ) from None
