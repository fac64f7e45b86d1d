"""A workspace's size on disk (SPEC 11): counted as `du -sb` counts it, recorded when it moved, and
summed per project for the disk budget."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bb_environments.domain.disk import human_bytes
from bb_environments.domain.errors import LimitReached
from bb_environments.handlers.application import Environments
from bb_environments.handlers.indexes import LiveLimits
from bb_environments.providers.host.disk_usage import tree_bytes
from bb_environments.providers.personal_workspace import PersonalWorkspaceProvider
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspace_messages import DiskUsageRequest
from bb_environments.providers.workspaces import LocalWorkspaces, provider_dir
from tests.unit.test_environment_lifecycle import make_ready, spawn
from tests.unit.test_local_workspaces import Lines


def du_sb(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def a_tree(root: Path, outside: Path) -> Path:
    """Nested directories, a hard link, a symlink to a big file outside and one to a directory."""
    (root / "src" / "deep" / "er").mkdir(parents=True)
    (root / "src" / "a.txt").write_text("a" * 10_000)
    (root / "src" / "deep" / "er" / "b.bin").write_bytes(b"b" * 250_000)
    os.link(root / "src" / "deep" / "er" / "b.bin", root / "hard-linked.bin")
    (outside / "huge.bin").write_bytes(b"h" * 2_000_000)
    (root / "link-to-huge").symlink_to(outside / "huge.bin")
    (root / "link-to-outside").symlink_to(outside, target_is_directory=True)
    (root / "empty").mkdir()
    return root


def test_a_tree_is_counted_as_du_sb_counts_it_without_following_symlinks(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "workspace").mkdir()
    root = a_tree(tmp_path / "workspace", tmp_path / "outside")

    assert tree_bytes(str(root)) == du_sb(root)
    assert tree_bytes(str(root)) < 2_000_000  # the symlinked file is not counted


def test_a_filesystem_mounted_inside_the_workspace_is_not_entered(tmp_path):
    root = tmp_path / "workspace"
    (root / "cache").mkdir(parents=True)
    (root / "own.bin").write_bytes(b"o" * 50_000)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root / "cache")]).returncode != 0:
        pytest.skip("mounting a tmpfs needs a privilege this process lacks")
    try:
        (root / "cache" / "other.bin").write_bytes(b"x" * 1_000_000)
        counted = tree_bytes(str(root))
        on_its_own = int(
            subprocess.run(["du", "-sbx", str(root)], capture_output=True, text=True, check=True).stdout.split()[0]
        )
    finally:
        subprocess.run(["umount", str(root / "cache")], check=True)
    assert counted is not None and counted < 1_000_000
    assert counted == on_its_own


def test_what_is_not_a_directory_has_no_size(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    assert tree_bytes(str(tmp_path / "missing")) is None
    assert tree_bytes(str(tmp_path / "file")) is None
    assert tree_bytes(str(tmp_path / "link")) is None


async def test_a_host_measures_only_its_providers_workspaces(tmp_path):
    workspaces = LocalWorkspaces(ProviderRegistry([PersonalWorkspaceProvider()]), tmp_path / "data", Lines())
    inside = provider_dir(tmp_path / "data", "personal-workspace") / "workspaces" / "t1"
    inside.mkdir(parents=True)
    (inside / "file").write_bytes(b"x" * 5000)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    usage = await workspaces.disk_usage(
        DiskUsageRequest(
            "local",
            [("personal-workspace", str(inside)), ("personal-workspace", str(elsewhere)), ("nope", str(inside))],
        )
    )

    assert usage.bytes == {str(inside): du_sb(inside)}


@pytest.fixture
def app():
    application = Environments(
        env={"PERSISTENCE_MODULE": "eventsourcing.popo"},
        grace_for=lambda _: 0,
        limits=LiveLimits(disk_bytes_per_project=1_000_000),
    )
    yield application
    application.close()


def test_a_figure_is_recorded_first_then_only_when_it_moved_by_more_than_five_percent(app):
    env = make_ready(app, spawn(app))
    path = env.path
    for figure in (100_000, 104_000, 96_000, 106_000, 106_000, 50_000):
        app.record_disk_usage([(env.id, path, figure)])
    recorded = [e.disk_bytes for e in app.events.get(env.id) if type(e).__name__ == "DiskMeasured"]
    assert recorded == [100_000, 106_000, 50_000]
    assert app.record_disk_usage([(env.id, "/another/path", 1)]) == []
    assert app.environment(env.id).disk_bytes == 50_000


def test_a_spawn_past_the_projects_disk_budget_is_refused_naming_it_and_the_usage(app):
    first = make_ready(app, spawn(app, "t1", "/data/worktrees/t1/repo"))
    second = make_ready(app, spawn(app, "t2", "/data/worktrees/t2/repo"))
    app.record_disk_usage([(first.id, first.path, 600_000)])
    spawn(app, "t3", "/data/worktrees/t3/repo")  # 600 kB of 1 MB: room
    app.record_disk_usage([(second.id, second.path, 500_000)])

    app.register_thread("t4", "/repo", None, "local", None)
    with pytest.raises(LimitReached) as refused:
        app.claim_environment("t4", "git-worktree", "local", "/repo", {}, "t4", "/data/worktrees/t4/repo")

    assert "take 1100000 bytes (1.0M)" in str(refused.value)
    assert "BB_MAX_DISK_BYTES_PER_PROJECT (1000000 bytes, 977K)" in str(refused.value)
    # A workspace made again (a retry) or gone no longer counts what it took.
    app.record_workspace_vanished(second.id, second.path)
    spawn(app, "t4", "/data/worktrees/t4/repo")


@pytest.mark.parametrize(
    ("count", "written"), [(0, "0B"), (1023, "1023B"), (1024, "1.0K"), (1_288_490_188, "1.2G"), (10 << 30, "10G")]
)
def test_sizes_read_as_du_h_writes_them(count, written):
    assert human_bytes(count) == written
