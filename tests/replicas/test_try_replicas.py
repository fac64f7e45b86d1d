"""scripts/try_replicas.py as a user runs it: the topology it starts takes a spawn through the
commands it prints, and its stop leaves no process and no directory behind."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from pathlib import Path

from scripts.try_replicas import READY

ROOT = Path(__file__).resolve().parents[2]
START_S = 120


def processes_naming(base: Path) -> list[str]:
    """The command lines of the processes that name `base` (nats-servers' configurations, PostgreSQL's data dir,
    the replicas' and agents' data dirs)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended while read
        if str(base) in command:
            found.append(command)
    return found


def exported(printed: list[str]) -> dict[str, str]:
    """The variables of the `export NAME=VALUE` lines the script printed."""
    variables = {}
    for line in printed:
        if line.startswith("export "):
            name, value = shlex.split(line.removeprefix("export "))[0].split("=", 1)
            variables[name] = value
    return variables


async def test_the_try_script_serves_a_spawn_with_what_it_prints_and_its_stop_leaves_nothing(tmp_path: Path) -> None:
    base = tmp_path / "try"
    script = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "scripts" / "try_replicas.py"),
        "--dir",
        str(base),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert script.stdin is not None and script.stdout is not None
    printed: list[str] = []
    try:
        async with asyncio.timeout(START_S):
            while READY not in printed:
                line = await script.stdout.readline()
                assert line, f"the script ended before it was ready: {''.join(printed)}"
                printed.append(line.decode().rstrip("\n"))

        environment = {**{k: v for k, v in os.environ.items() if not k.startswith("BB_")}, **exported(printed)}
        spawn = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bb_environments.entrypoints.bb",
            "thread",
            "spawn",
            "--environment-provider",
            "personal-workspace",
            "--host",
            "h2",
            "--wait",
            "--json",
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(spawn.communicate(), 60)
        assert spawn.returncode == 0, err.decode()
        assert json.loads(out)["status"] == "ready", out.decode()

        script.stdin.write(b"stop\n")
        await script.stdin.drain()
        rest, _ = await asyncio.wait_for(script.communicate(), 60)
    finally:
        if script.returncode is None:
            script.kill()
            await script.wait()
    assert script.returncode == 0, rest.decode()
    assert rest.decode().splitlines()[-1] == "stopped"
    postgres_data = Path(
        next(re.search(r"\(data dir (\S+)\)", line) for line in printed if line.startswith("PostgreSQL ")).group(1)
    )  # apart from `base` under root
    assert not base.exists() and not postgres_data.exists()
    assert processes_naming(base) == [] and processes_naming(postgres_data) == []


async def test_the_try_script_without_postgresqls_driver_says_in_one_line_what_to_install(tmp_path: Path) -> None:
    without_driver = (
        "import runpy, sys; sys.modules['psycopg'] = None; sys.argv = ['try_replicas.py']; "
        f"runpy.run_path({str(ROOT / 'scripts' / 'try_replicas.py')!r}, run_name='__main__')"
    )
    script = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        without_driver,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await script.communicate()
    assert script.returncode == 1 and out == b""
    assert err.decode().splitlines() == [
        "scripts/try_replicas.py needs psycopg, which bb's test extra installs: pip install -e '.[test]'"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing made
