"""Nothing a hook starts outlives its environment (SPEC 9), whatever session, process group or
working directory it moves to; a setup's dev server runs for as long as the environment is live."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bb_environments.providers.host.containment import _unified_mount
from bb_environments.providers.host.processes import pid_alive
from tests.integration.conftest import Service, eventually, service_environment

CONTAINMENT_LOG_FRAGMENT = "hook processes are "


def daemon_setup(pid_file: Path) -> str:
    """A setup that leaves a dev server behind the way daemons hide: a new session, `cd /`, and a
    double fork, so that its parent is gone and its group and cwd are nobody's."""
    return (
        "setsid bash -c 'cd / && bash -c \"echo \\$\\$ > " + str(pid_file) + '; exec sleep 600" '
        "</dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1 &\n"
        "echo dev server started\n"
    )


def commit_setup(repo: Path, setup: str) -> None:
    (repo / ".bb-env-setup.sh").write_text(setup)
    subprocess.run(["git", "-C", str(repo), "add", ".bb-env-setup.sh"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo), "commit", "-qm", "setup"], check=True
    )


async def spawn_ready(service: Service, repo: Path, thread_id: str) -> str:
    return await service.spawn("git-worktree", "--wait", project=repo, thread_id=thread_id)


def daemon_pid(pid_file: Path) -> int:
    pid = int(pid_file.read_text())
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert stat[stat.rindex(")") + 2 :].split()[2] != stat.split()[0], "the daemon leads no group of the hook's"
    assert Path(f"/proc/{pid}/cwd").resolve() == Path("/")
    return pid


async def test_a_daemon_a_setup_left_runs_while_ready_and_ends_with_its_environment(service, git_repo, tmp_path):
    pid_file = tmp_path / "daemon.pid"
    commit_setup(git_repo, daemon_setup(pid_file))
    environment_id = await spawn_ready(service, git_repo, "t1")
    await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the daemon's start")
    pid = daemon_pid(pid_file)
    assert (await service.show(environment_id))["status"] == "ready"
    assert pid_alive(pid), "the setup's dev server must keep running while the environment is ready"

    assert (await service.bb("thread", "archive", "t1")).returncode == 0
    await service.wait_for(environment_id, "removed")
    assert not pid_alive(pid), "the daemon outlived its environment's removal"
    lines = [line for line in service.log_tail().splitlines() if CONTAINMENT_LOG_FRAGMENT in line]
    assert len(lines) == 1, lines  # one line says how hooks are contained, and what escapes it


async def test_a_removal_after_a_crash_still_ends_what_the_hooks_left(tmp_path, git_repo):
    pid_file = tmp_path / "daemon.pid"
    commit_setup(git_repo, daemon_setup(pid_file))
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir, BB_CRASH_AT="teardown-finished"))
    await service.start()
    try:
        environment_id = await spawn_ready(service, git_repo, "t1")
        await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the daemon's start")
        pid = daemon_pid(pid_file)
        archived = await service.bb("thread", "archive", "t1")
        # With no teardown script the teardown settles at once, so the crash after it may come
        # before the archive's answer: the CLI then says the request may have taken effect.
        assert archived.returncode == 0 or "may have taken effect" in archived.stderr, archived.stderr
        assert service.process is not None
        await eventually(lambda: service.process.poll() is not None, "the crash after the teardown", 60)
        assert pid_alive(pid)  # the crash came before the removal: nothing has ended it yet

        await service.stop()
        service.environment["BB_CRASH_AT"] = ""
        await service.start()
        await service.wait_for(environment_id, "removed")
        assert not pid_alive(pid), "the daemon outlived the removal retried after a crash"
    finally:
        await service.stop()


def without_a_writable_cgroup_hierarchy() -> tuple[str, ...]:
    """A command prefix that runs its command in a mount namespace of its own where the cgroup v2
    hierarchy is read-only, as it is for an agent that is not root (whose hooks run as itself);
    a test skips where that cannot be made."""
    mount = _unified_mount()
    remount = 'mount -o remount,bind,ro "$0" && exec "$@"'
    if (
        mount is None
        or shutil.which("unshare") is None
        or subprocess.run(["unshare", "--mount", "sh", "-c", remount, mount, "true"], capture_output=True).returncode
        != 0
    ):
        pytest.skip("a mount namespace with a read-only cgroup hierarchy cannot be made here (needs root and unshare)")
    return ("unshare", "--mount", "sh", "-c", remount, mount)


async def test_an_agent_that_cannot_write_the_cgroup_hierarchy_still_ends_a_daemon_its_setup_left(tmp_path, git_repo):
    """Its hooks' processes are found by the variable in their environment (providers/host/containment.py,
    MarkerContainment), which every process a hook starts must therefore hold."""
    pid_file = tmp_path / "daemon.pid"
    commit_setup(git_repo, daemon_setup(pid_file))
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir), wrapper=without_a_writable_cgroup_hierarchy())
    await service.start()
    try:
        assert "hook processes are found by the BB_ENVIRONMENT_ID in their environment" in service.log_tail()
        environment_id = await spawn_ready(service, git_repo, "t1")
        await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the daemon's start")
        pid = daemon_pid(pid_file)
        assert pid_alive(pid), "the setup's dev server must keep running while the environment is ready"

        assert (await service.bb("thread", "archive", "t1")).returncode == 0
        await service.wait_for(environment_id, "removed")
        assert not pid_alive(pid), "the daemon outlived its environment's removal"
    finally:
        await service.stop()


LIMITS = {"BB_MAX_PIDS_PER_ENVIRONMENT": "32", "BB_MAX_MEMORY_PER_ENVIRONMENT": str(128 << 20)}


@pytest.mark.parametrize("service", [LIMITS], indirect=True)
@pytest.mark.parametrize(
    ("setup", "named"),
    [
        # More processes at once than the environment may have: the fork that passes the limit is refused.
        (
            f'{sys.executable} -c \'import subprocess\nfor _ in range(64): subprocess.Popen(["sleep", "60"])\'\n',
            "BB_MAX_PIDS_PER_ENVIRONMENT (32 processes)",
        ),
        # More memory than it may use, written so that it is really used: the kernel kills the process.
        (f"{sys.executable} -c 'hog = b\"x\" * (512 << 20)'\n", "BB_MAX_MEMORY_PER_ENVIRONMENT (128 MiB)"),
    ],
    ids=["pids", "memory"],
)
async def test_a_setup_that_hits_its_environments_limit_fails_naming_it(service, git_repo, setup, named):
    if f"{named} in " not in service.log_tail():
        pytest.skip(f"no writable cgroup holds {named} here: {service.log_tail()}")
    commit_setup(git_repo, setup)
    environment_id = await service.spawn("git-worktree", project=git_repo, thread_id="t1")

    failed = await service.wait_for(environment_id, "error")
    assert failed["statusMessage"].endswith(f": the setup hit {named}"), failed["statusMessage"]
    transcript = (await service.bb("environment", "logs", environment_id)).stdout
    assert f"the setup hit {named}" in transcript
    assert (await service.bb("thread", "archive", "t1")).returncode == 0
    await service.wait_for(environment_id, "removed")
