"""The built wheel installs like a library: one `bb_environments` package, package data included,
and a `bb` that serves and spawns from site-packages rather than from this source tree."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import site
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
# A hook run by the installed package: its launcher and supervisor (`python -I -S`, no
# site-packages) must find the package where the wheel put it.
RUN_A_HOOK = """\
import asyncio, sys
from pathlib import Path
from bb_environments.hooks.launcher_client import IMPORT_ROOT
from bb_environments.hooks.runner import HookRunner

async def main():
    lines = []
    async def collect(line, offset):
        lines.append(line)
    runner = HookRunner(Path(sys.argv[1]), 60)
    outcome = await runner.run("op", "setup", Path(sys.argv[2]), collect)
    runner.close()
    print(IMPORT_ROOT, outcome.status, *lines)

asyncio.run(main())
"""


def run(*command: str | Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], env=env, cwd="/", capture_output=True, text=True, timeout=timeout
    )


def serving_line(service: subprocess.Popen, deadline: float) -> str:
    """What `bb serve` printed up to the line it prints once it serves (all it printed, if it
    stopped or the deadline passed first); the rest of its output is drained from then on."""
    assert service.stderr is not None
    printed = []
    with selectors.DefaultSelector() as selector:
        selector.register(service.stderr, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0 and selector.select(left):
            line = service.stderr.readline().decode(errors="replace")
            if not line:
                break  # it exited
            printed.append(line)
            if line.startswith("bb serving on"):
                threading.Thread(target=service.stderr.read, daemon=True).start()
                return line
    return "".join(printed)


class Installed(NamedTuple):
    venv: Path
    python: Path
    site: Path
    environment: dict[str, str]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from this tree, installed into a fresh venv (once for this file's tests)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    # Built from a copy: an in-tree build would leave build/ in the checkout, whose stale files
    # (of modules since moved or deleted) a later build would ship.
    source = tmp_path / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache"
        ),
    )
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("bb_environments-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # The dependencies come from this test's environment (a plain path entry, so its editable
    # finder for this source tree is not loaded); bb-environments itself only from the wheel.
    venv_site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", env=os.environ.copy()
        ).stdout.strip()
    )
    (venv_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BB_") and k != "PYTHONPATH"}
    environment.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        BB_DATA_DIR=str(tmp_path / "data"),
        BB_RETIRE_GRACE_MS="0",
    )
    pip_installed = run(python, "-m", "pip", "install", "--quiet", "--no-deps", wheel, env=environment, timeout=300)
    assert pip_installed.returncode == 0, pip_installed.stderr

    where = run(
        python,
        "-c",
        "import bb_environments.domain as d, bb_environments.providers.modal_settings as m; "
        "print(d.__file__); print(m.SHIPPED_DOCKERFILE.is_file())",
        env=environment,
    )
    location, dockerfile_shipped = where.stdout.split()
    assert location.startswith(str(venv_site)) and dockerfile_shipped == "True", where.stderr
    for generic in ("domain", "bus", "handlers", "providers", "projections", "entrypoints"):
        assert run(python, "-c", f"import {generic}", env=environment).returncode != 0, generic

    return Installed(venv, python, venv_site, environment)


def test_a_spawn_from_the_installed_wheel(installed: Installed, tmp_path: Path) -> None:
    venv, python, venv_site, environment = installed
    environment = environment | {"BB_DATA_DIR": str(tmp_path / "data")}
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / ".bb-env-setup.sh").write_text("echo set up\n")
    hooked = run(python, "-c", RUN_A_HOOK, tmp_path / "hook-records", workspace, env=environment)
    assert hooked.returncode == 0, hooked.stderr
    import_root, status, *output = hooked.stdout.split()
    assert import_root.startswith(str(venv_site)) and (status, output) == ("succeeded", ["set", "up"]), hooked.stdout

    service = subprocess.Popen(
        [venv / "bin" / "bb", "serve"], env=environment, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        announced = serving_line(service, deadline=time.monotonic() + 60)
        assert announced.startswith("bb serving on"), announced
        spawned = run(
            venv / "bin" / "bb",
            "thread",
            "spawn",
            "--environment-provider",
            "personal-workspace",
            "--wait",
            "--json",
            env=environment,
        )
        assert spawned.returncode == 0, spawned.stderr
        assert json.loads(spawned.stdout)["status"] == "ready"

        # A listing needs the data dir as text only: pathlib (which loads urllib.parse and
        # ipaddress) would be a tenth of its run. Seen here, from a wheel: the editable install's
        # finder loads pathlib in every process of its venv.
        listed = run(python, "-X", "importtime", venv / "bin" / "bb", "environment", "list", "--json", env=environment)
        assert listed.returncode == 0, listed.stderr
        assert [e["status"] for e in json.loads(listed.stdout)["environments"]] == ["ready"]
        imported = {
            line.rpartition("|")[2].strip() for line in listed.stderr.splitlines() if line.startswith("import time:")
        }
        assert (
            "bb_environments.bus.api_client.blocking_client" in imported and not {"pathlib", "urllib.parse"} & imported
        )
    finally:
        service.terminate()
        service.wait(timeout=30)


CONSUMER = """\
from bb_environments.client import Client, EnvironmentEvent, PlacementOutcome, PlacementRefused


async def placed(thread_id: str) -> str | None:
    async with await Client.connect() as client:
        await client.spawn(thread_id, provider="personal-workspace")
        try:
            outcome: PlacementOutcome = await client.wait_ready(thread_id, timeout=60)
        except PlacementRefused as refused:
            return refused.outcome.reason
        async for event in client.environment_events(outcome.environment_id or "", follow=False):
            version: int = event.version
            print(version)
        not_a_number: int = outcome.thread_id
        return outcome.environment_id
"""


def test_a_consumer_s_type_checker_reads_the_client_s_types_from_the_installed_wheel(
    installed: Installed, tmp_path: Path
) -> None:
    consumer = tmp_path / "consumer.py"
    consumer.write_text(CONSUMER)
    checked = run(
        installed.python, "-m", "mypy", "--strict", "--no-incremental", consumer, env=installed.environment, timeout=300
    )
    # One error, where the script is wrong on purpose: its types are the client's, not Any.
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "consumer.py:14: error: Incompatible types in assignment" in errors[0], checked.stdout
