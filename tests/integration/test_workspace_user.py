"""BB_WORKSPACE_USER (SPEC 9): that user owns the workspaces and runs their hooks, its git works
there, and it can read no credential, store or state file of the service."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_git
from tests.integration.conftest import Service, service_environment
from tests.support.os_users import unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="making a user and running hooks as it needs root and useradd",
)


@pytest.fixture
def workspace_user() -> Iterator[pwd.struct_passwd]:
    with unprivileged_user(f"bbws{uuid.uuid4().hex[:8]}", with_home=True) as account:
        yield account


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory any user may pass through, unlike pytest's tmp dirs (0700): the data dir and
    the project live in it, as they would in a deployment."""
    base = Path(tempfile.mkdtemp(prefix="bb-workspace-user-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def project_with_setup(base: Path, setup: str) -> Path:
    repo = base / "repo"
    repo.mkdir()
    run_git(repo, "init", "--quiet", "--initial-branch=main")
    (repo / "README.md").write_text("hello\n")
    (repo / ".bb-env-setup.sh").write_text(setup)
    run_git(repo, "add", "README.md", ".bb-env-setup.sh")
    run_git(repo, "commit", "--quiet", "-m", "initial")
    return repo


def readable_by(path: Path, root: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` could read `path`, reached by name from `root`: every directory on the way
    must let it pass, and the file let it read (the owner's, the group's or the others' bits)."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))

    def allows(target: Path, owner_bit: int) -> bool:
        info = os.lstat(target)
        if info.st_uid == user.pw_uid:
            return bool(info.st_mode & owner_bit)
        if info.st_gid in groups:
            return bool(info.st_mode & (owner_bit >> 3))
        return bool(info.st_mode & (owner_bit >> 6))

    ancestors = [
        root,
        *(root / Path(*path.relative_to(root).parts[:i]) for i in range(1, len(path.relative_to(root).parts))),
    ]
    return all(allows(directory, stat.S_IXUSR) for directory in ancestors) and allows(path, stat.S_IRUSR)


async def test_hooks_run_as_the_workspace_user_which_owns_the_workspace_and_reads_no_seed(workspace_user, open_base):
    data_dir = open_base / "data"
    report = open_base / "report"
    report.mkdir(mode=0o777)
    report.chmod(0o777)
    service = Service(data_dir, service_environment(data_dir, BB_WORKSPACE_USER=workspace_user.pw_name))
    await service.start()
    try:
        seeds = sorted((data_dir / "credentials").glob("*.nk"))
        assert seeds
        tries = "".join(f"cat {seed} >/dev/null 2>&1 && echo read {seed} || echo refused {seed}\n" for seed in seeds)
        repo = project_with_setup(
            open_base,
            (
                f"id -u > {report}/uid\n"
                f'echo "$HOME" > {report}/home\n'
                f"{{\n{tries}}} > {report}/seeds\n"
                f"git status --porcelain > {report}/git 2>&1; echo $? > {report}/git-status\n"
            ),
        )
        spawned = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(repo),
            "--thread-id",
            "t1",
            "--wait",
            "--json",
        )
        assert spawned.returncode == 0, spawned.stderr + service.log_tail()
        environment = await service.show(spawned.json()["environmentId"])

        assert int((report / "uid").read_text()) == workspace_user.pw_uid
        assert (report / "home").read_text().strip() == workspace_user.pw_dir
        assert os.stat(environment["path"]).st_uid == workspace_user.pw_uid
        assert (report / "seeds").read_text().split("\n")[:-1] == [f"refused {seed}" for seed in seeds]
        assert (report / "git-status").read_text().strip() == "0", (report / "git").read_text()

        reachable = [
            path
            for path in data_dir.rglob("*")
            if not path.is_relative_to(environment["path"])
            and not path.is_dir()
            and readable_by(path, data_dir, workspace_user)
        ]
        assert reachable == [], f"the workspace user can read these files of the service: {reachable}"

        assert (await service.bb("thread", "archive", "t1")).returncode == 0
        removed = await service.wait_for(environment["id"], "removed")
        assert not os.path.exists(environment["path"]), removed
    finally:
        await service.stop()


async def test_a_workspace_user_that_does_not_exist_stops_the_start_naming_it(open_base):
    data_dir = open_base / "data"
    service = Service(data_dir, service_environment(data_dir, BB_WORKSPACE_USER="no-such-bb-user"))
    with pytest.raises(RuntimeError, match="BB_WORKSPACE_USER 'no-such-bb-user' names no user on this machine"):
        await service.start()
    assert service.process is not None and service.process.returncode == 1


async def test_with_git_hooks_run_the_post_checkout_hook_runs_as_the_workspace_user_too(workspace_user, open_base):
    data_dir = open_base / "data"
    report = open_base / "report"
    report.mkdir()
    report.chmod(0o777)
    repo = project_with_setup(open_base, "echo set up\n")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\nid -u > {report}/uid\n")
    hook.chmod(0o755)
    service = Service(
        data_dir, service_environment(data_dir, BB_WORKSPACE_USER=workspace_user.pw_name, BB_GIT_HOOKS="run")
    )
    await service.start()
    try:
        spawned = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(repo),
            "--thread-id",
            "t1",
            "--wait",
            "--json",
        )
        assert spawned.returncode == 0, spawned.stderr + service.log_tail()
        assert int((report / "uid").read_text()) == workspace_user.pw_uid
    finally:
        await service.stop()
