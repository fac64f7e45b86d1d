import subprocess
import threading
from pathlib import Path

import pytest

from bb_environments.providers.contract import (
    READY,
    CreateContext,
    Created,
    CreateFailed,
    EnvironmentProvider,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveFailed,
)
from bb_environments.providers.personal_workspace import PersonalWorkspaceProvider
from tests.conftest import RecordingReporter

PATH_KEY = "thread-1"


@pytest.fixture
def provider() -> PersonalWorkspaceProvider:
    return PersonalWorkspaceProvider()


def create_context(data_dir: Path, path_key: str = PATH_KEY) -> CreateContext:
    return CreateContext(
        "local", None, None, str(data_dir), thread_id="t1", path_key=path_key, report=RecordingReporter()
    )


def remove_context(
    data_dir: Path, path: Path | str | None, path_key: str = PATH_KEY, cancelled: threading.Event | None = None
) -> RemoveContext:
    return RemoveContext(
        "local",
        str(data_dir),
        None,
        None,
        None if path is None else str(path),
        path_key,
        1,
        None,
        report=RecordingReporter(),
        cancelled=cancelled or threading.Event(),
    )


def created_path(provider: PersonalWorkspaceProvider, data_dir: Path) -> Path:
    result = provider.create(create_context(data_dir))
    assert isinstance(result, Created)
    return Path(result.path)


def test_declaration_satisfies_the_contract(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    context = ProjectContext("local", None, None, str(data_dir))
    assert isinstance(provider, EnvironmentProvider)
    assert provider.requires.projectless and provider.inputs_type is None
    assert provider.policy.children == "share"
    assert provider.availability(context) == READY
    provider.validate(context)


def test_create_makes_the_planned_directory(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    planned = provider.planned_path(ProjectContext("local", None, None, str(data_dir)), PATH_KEY)
    context = create_context(data_dir)
    result = provider.create(context)
    assert result == Created(path=str(data_dir / "workspaces" / PATH_KEY), owns_path=True, empty=True)
    assert planned == result.path and Path(result.path).is_dir()
    assert context.report.steps == ["Preparing personal workspace"]


def test_create_again_keeps_the_contents(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    workspace = created_path(provider, data_dir)
    (workspace / ".bb-env-setup.sh").write_text("echo keep me\n")
    again = provider.create(create_context(data_dir))
    # Not said to be empty: the directory was there already, and the core must look for a setup script.
    assert again == Created(path=str(workspace), owns_path=True)
    assert (workspace / ".bb-env-setup.sh").read_text() == "echo keep me\n"


def test_a_file_where_the_workspace_goes_is_a_failure(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    in_the_way = data_dir / "workspaces" / PATH_KEY
    in_the_way.parent.mkdir(parents=True)
    in_the_way.write_text("not a directory\n")
    assert isinstance(provider.create(create_context(data_dir)), CreateFailed)
    assert in_the_way.read_text() == "not a directory\n"


@pytest.mark.parametrize("path_key", ["../escape", "a/b", ".hidden", "-option", ""])
def test_unsafe_path_keys_are_refused(provider: PersonalWorkspaceProvider, data_dir: Path, path_key: str) -> None:
    result = provider.create(create_context(data_dir, path_key))
    assert isinstance(result, CreateFailed) and result.failure == "terminal"
    with pytest.raises(ValueError):
        provider.planned_path(ProjectContext("local", None, None, str(data_dir)), path_key)
    assert isinstance(provider.remove(remove_context(data_dir, None, path_key)), RemoveFailed)
    assert not (data_dir / "escape").exists()


def test_remove_deletes_the_workspace_and_is_idempotent(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    workspace = created_path(provider, data_dir)
    (workspace / "nested").mkdir()
    (workspace / "nested" / "file").write_text("x")
    assert provider.remove(remove_context(data_dir, workspace)) == Removed()
    assert not workspace.exists()
    assert provider.remove(remove_context(data_dir, workspace)) == Removed()


def test_remove_without_a_path_finds_the_workspace_by_path_key(
    provider: PersonalWorkspaceProvider, data_dir: Path
) -> None:
    workspace = created_path(provider, data_dir)
    assert provider.remove(remove_context(data_dir, None)) == Removed()
    assert not workspace.exists()


def test_remove_deletes_read_only_directories(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    workspace = created_path(provider, data_dir)
    locked = workspace / "cache"
    locked.mkdir()
    (locked / "module").write_text("x")
    locked.chmod(0o500)
    assert provider.remove(remove_context(data_dir, workspace)) == Removed()
    assert not workspace.exists()


def test_remove_refuses_paths_outside_the_workspace_root(
    provider: PersonalWorkspaceProvider, data_dir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = data_dir / "workspaces"
    root.mkdir()
    (root / "sneaky").symlink_to(elsewhere)
    for path in (elsewhere, root, root / "sneaky", root / ".." / "workspaces"):
        result = provider.remove(remove_context(data_dir, path))
        assert isinstance(result, RemoveFailed) and "outside the personal workspace root" in result.message
    assert elsewhere.is_dir() and root.is_dir()


def test_remove_stops_processes_running_in_the_workspace(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    workspace = created_path(provider, data_dir)
    (workspace / "sub").mkdir()
    sleeper = subprocess.Popen(["sleep", "60"], cwd=workspace / "sub")
    try:
        context = remove_context(data_dir, workspace)
        assert provider.remove(context) == Removed()
        assert sleeper.wait(timeout=5) != 0
        assert context.report.logs == ["Stopped 1 process(es) running in the workspace"]
    finally:
        sleeper.kill()
    assert not workspace.exists()


def test_remove_stops_when_cancelled(provider: PersonalWorkspaceProvider, data_dir: Path) -> None:
    workspace = created_path(provider, data_dir)
    cancelled = threading.Event()
    cancelled.set()
    assert provider.remove(remove_context(data_dir, workspace, cancelled=cancelled)) == RemoveFailed("cancelled")
    assert workspace.is_dir()
