"""`bb secret set|list|remove`: the secrets a project's setup and teardown hooks get (SPEC 11).

A value is read from stdin, never from the command line: every user of the machine can read a
process's arguments (`ps`), and shells keep them in their history."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from bb_environments.bus.wire.api_messages import ProjectRef, SecretRef, SetSecret
from bb_environments.domain.secret_names import secret_name_refusal
from bb_environments.entrypoints.cli.connection import call
from bb_environments.entrypoints.cli.support import Failure, emit, json_option, print_table, run_command, stdout
from bb_environments.entrypoints.config import Settings

project_option = click.option(
    "--project", required=True, help="The project whose hooks get the secret: its path (a git repository)."
)


@click.command("set")
@project_option
@click.argument("name")
@click.option(
    "--value",
    is_flag=False,
    flag_value="",  # `--value` alone is refused the same way, not as an option missing its argument
    hidden=True,
    help="Refused: a value on the command line is seen by every user of the machine; pipe it on stdin.",
)
@json_option
@click.pass_obj
@run_command
def secret_set(settings: Settings, project: str, name: str, value: str | None, as_json: bool) -> None:
    """Set a secret of a project from stdin: its setup and teardown hooks get it as the variable NAME."""
    if value is not None:
        raise Failure(
            "invalid_input",
            "--value is refused: a value on the command line is seen by every user of the machine "
            f"(ps) and kept in shell history; pipe it on stdin instead, e.g. "
            f'`printf %s "$TOKEN" | bb secret set --project {project} {name}`',
        )
    refusal = secret_name_refusal(name)
    if refusal is not None:  # before a value is asked for
        raise Failure("invalid_input", refusal)
    secret = _value_from_stdin(name)
    set_ = call(
        settings, "secrets", "set", SetSecret(project_path=os.path.abspath(project), name=name, value=secret), True
    )
    emit(
        set_,
        as_json,
        lambda d: stdout.print(f"secret {d['name']} of {d['projectPath']} set at {d['setAt']}", markup=False),
    )


@click.command("list")
@project_option
@json_option
@click.pass_obj
@run_command
def secret_list(settings: Settings, project: str, as_json: bool) -> None:
    """List a project's secrets: their names and when each was set, never their values."""
    listed = call(settings, "secrets", "list", ProjectRef(project_path=os.path.abspath(project)))

    def human(d: dict[str, Any]) -> None:
        print_table(["NAME", "SET AT"], [[s["name"], s["setAt"]] for s in d["secrets"]])

    emit(listed, as_json, human)


@click.command("remove")
@project_option
@click.argument("name")
@json_option
@click.pass_obj
@run_command
def secret_remove(settings: Settings, project: str, name: str, as_json: bool) -> None:
    """Remove a secret of a project: hooks that start from now on no longer get it."""
    removed = call(
        settings, "secrets", "remove", SecretRef(project_path=os.path.abspath(project), name=name), changes=True
    )
    emit(removed, as_json, lambda d: stdout.print(f"secret {d['name']} of {d['projectPath']} removed", markup=False))


def _value_from_stdin(name: str) -> str:
    """All of stdin, without the one line end `echo` adds; asked for unseen on a terminal."""
    if sys.stdin.isatty():
        value: str = click.prompt(f"value of {name}", hide_input=True, err=True)
        return value
    try:
        value = sys.stdin.buffer.read().decode()
    except UnicodeDecodeError:
        raise Failure("invalid_input", f"the value of secret {name} on stdin is not UTF-8 text") from None
    if value.endswith("\n"):
        value = value[:-2] if value.endswith("\r\n") else value[:-1]
    if not value:
        raise Failure(
            "invalid_input",
            f'no value for secret {name} on stdin: pipe it in, e.g. `printf %s "$TOKEN" | bb secret set ...`',
        )
    return value
