"""`bb --version` (SPEC section 8.2) and `-h`, through the console script as a user runs it."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import sys
from pathlib import Path

import click

from bb_environments.entrypoints.cli import cli
from tests.integration.test_cli_start_up import SLOW_TO_IMPORT, bb_loading


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under `command`, the lazily loaded ones too."""
    paths = [path]
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub_command = command.get_command(context, name)
            assert sub_command is not None, name
            paths.extend(command_paths(sub_command, (*path, name)))
    return paths


async def bb(environment: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("bb")),
        *args,
        env=environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_version_prints_the_installed_package_s_version_and_nothing_else_looks_it_up(tmp_path):
    environment = {**os.environ, "BB_DATA_DIR": str(tmp_path)}
    code, out, err = await bb(environment, "--version")
    assert (code, out, err) == (0, f"bb {importlib.metadata.version('bb-environments')}\n", "")

    code, _, loaded = await bb_loading(environment, (*SLOW_TO_IMPORT, "nats"), "--version")
    assert code == 0 and loaded == []
    # Found when asked for: a command that is not --version reads no package metadata at start-up.
    code, _, loaded = await bb_loading(environment, ("importlib.metadata",), "thread", "--help")
    assert code == 0 and loaded == []


async def test_h_is_help_on_every_command(tmp_path):
    environment = {**os.environ, "BB_DATA_DIR": str(tmp_path), "COLUMNS": "100"}
    paths = command_paths(cli)
    assert ("serve",) in paths and ("modal", "image", "set") in paths
    running = asyncio.Semaphore(4)

    async def both(path: tuple[str, ...]) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
        async with running:
            return await bb(environment, *path, "-h"), await bb(environment, *path, "--help")

    for path, (short, long) in zip(paths, await asyncio.gather(*(both(path) for path in paths))):
        assert short == long, path
        code, out, err = short
        assert code == 0 and err == "" and out.startswith(f"Usage: {' '.join(('bb', *path))} "), (path, out, err)
        assert "-h, --help" in out, path
