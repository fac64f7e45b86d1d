"""A data dir made by the release before leases keeps working under this one (issue 31).

The previous release is this repository at the last commit before port blocks and slugs were
leased: its tree is taken out of git, and its own `bb serve` makes the data dir, with a worktree
whose setup left a daemon listening on a port of the new range, a personal workspace, and one
removed. Then this release's `bb serve` runs on that data dir. The environments of the earlier
release keep no slug and no ports (docs/concepts.md says why: their setup ran without them), a new
spawn gets a block that holds no port they listen on, and their removal works, ending what their
setup left running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import Service, eventually, service_environment, write_hooks

PREVIOUS_RELEASE = "6883d4bf051986ffd9567d45afad62f1885febce"
"""The first parent of the commit that leased port blocks and slugs (`git log domain/leases.py`)."""
REPOSITORY = Path(__file__).resolve().parents[2]
FOLDERS = ("domain", "projections", "handlers", "providers", "hooks", "bus", "entrypoints", "client")
"""The folders the package installs as `bb_environments.<folder>` (pyproject.toml, package-dir)."""


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes `bb_environments` the previous release's code."""
    known = subprocess.run(["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"])
    if known.returncode != 0:
        pytest.skip(f"this checkout has no history back to the previous release ({PREVIOUS_RELEASE[:10]})")
    source = tmp_path / "previous-release"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", PREVIOUS_RELEASE, *FOLDERS], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    package = tmp_path / "previous-path" / "bb_environments"
    package.mkdir(parents=True)
    for folder in FOLDERS:
        (package / folder).symlink_to(source / folder, target_is_directory=True)
    return package.parent


def a_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def spawn(service: Service, thread_id: str, provider: str, *project: str) -> str:
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", provider, *project, "--thread-id", thread_id, "--json"
    )
    assert spawned.returncode == 0, spawned.stderr
    return spawned.json()["environmentId"]


async def test_a_data_dir_of_the_release_before_leases_keeps_working(previous_release, git_repo, tmp_path):
    port = a_free_port()
    daemon_pid = tmp_path / "daemon.pid"
    # The first setup leaves a daemon listening on `port`, as a dev server would; later ones do not.
    daemon = (
        f"import os, socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
        f"open('{daemon_pid}', 'w').write(str(os.getpid())); time.sleep(1000)"
    )
    write_hooks(
        git_repo,
        tmp_path / "hooks.log",
        setup=f'echo "[$BB_ENVIRONMENT_SLUG][$BB_PORT]" > bb-vars\n'
        f'if [ ! -e {tmp_path}/listened ]; then touch {tmp_path}/listened; (cd / && setsid {sys.executable} -c "{daemon}" >/dev/null 2>&1 &); fi',
    )
    worktree = ("--project", str(git_repo))
    data_dir = tmp_path / "data"

    before = Service(data_dir, service_environment(data_dir, PYTHONPATH=str(previous_release)))
    await before.start()
    try:
        old_worktree = await spawn(before, "old-worktree", "git-worktree", *worktree)
        old_personal = await spawn(before, "old-personal", "personal-workspace")
        old_removed = await spawn(before, "old-removed", "personal-workspace")
        assert (await before.bb("thread", "archive", "old-removed", "--wait")).returncode == 0
        old = await before.wait_for(old_worktree, "ready")
        await before.wait_for(old_personal, "ready")
        assert "slug" not in old and "ports" not in old  # the release before leases knows neither
        assert (Path(old["path"]) / "bb-vars").read_text() == "[][]\n"
        await eventually(lambda: listening(port), "the old setup's daemon listening")
    finally:
        await before.stop()

    after = Service(
        data_dir,
        service_environment(
            data_dir, BB_PORT_RANGE=f"{port}-{port + 29}", BB_PORTS_PER_ENVIRONMENT="10", BB_DISK_SCAN_INTERVAL_S="1"
        ),
    )
    await after.start()
    try:
        listed = {e["id"]: e for e in (await after.bb("environment", "list", "--all", "--json")).json()["environments"]}
        assert {key: listed[key]["status"] for key in listed} == {
            old_worktree: "ready",
            old_personal: "ready",
            old_removed: "removed",
        }
        assert all(listed[key]["slug"] is None and listed[key]["ports"] is None for key in listed)
        # Measured like any live workspace.
        await after.wait_for(old_worktree, lambda e: e["diskBytes"])

        new = await spawn(after, "new-worktree", "git-worktree", *worktree)
        placed = await after.wait_for(new, "ready")
        block = range(placed["ports"]["first"], placed["ports"]["first"] + placed["ports"]["count"])
        assert port not in block and block.stop <= port + 30, block  # the old daemon's port kept out
        assert (Path(placed["path"]) / "bb-vars").read_text() == f"[{placed['slug']}][{block.start}]\n"

        for thread_id, environment_id in (("old-worktree", old_worktree), ("old-personal", old_personal)):
            archived = await after.bb("thread", "archive", thread_id, "--wait")
            assert archived.returncode == 0, archived.stderr
            assert (await after.show(environment_id))["status"] == "removed"
        assert not Path(old["path"]).exists()
        await eventually(lambda: not listening(port), "the old setup's daemon ended with its environment")
        assert (await after.show(new))["status"] == "ready"
    finally:
        await after.stop()
        if daemon_pid.exists():
            try:
                os.kill(int(daemon_pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "Traceback" not in after.log_tail()
