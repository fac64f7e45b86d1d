"""Every option of every `bb` command says in its help what it does."""

from __future__ import annotations

import click

from bb_environments.entrypoints.cli import cli


def options_without_help(command: click.Command, path: tuple[str, ...]) -> list[str]:
    silent = [
        f"{' '.join(path)} {'/'.join(p.opts)}"
        for p in command.params
        if isinstance(p, click.Option) and not p.hidden and not p.help
    ]
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None:
                silent += options_without_help(sub, (*path, name))
    return silent


def test_every_option_of_every_command_has_help_text():
    assert options_without_help(cli, ("bb",)) == []
