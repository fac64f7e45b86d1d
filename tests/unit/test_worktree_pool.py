"""git-worktree's pooling (SPEC 10) on real repositories: where a member would be prepared, a
member's inputs, the rename that binds it to a thread, and the removal of a member no thread took."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from bb_environments.providers.contract import (
    BindContext,
    BindFailed,
    CreateContext,
    Created,
    InvalidInputs,
    ProjectContext,
    RemoveContext,
    Removed,
    can_pool,
)
from bb_environments.providers.git_worktree import (
    DefaultBranch,
    ExistingBranch,
    GitWorktreeInputs,
    GitWorktreeProvider,
    NewBranch,
)

Git = Callable[..., str]
MEMBER_KEY = "pool-0123456789ab"


def context(repo: Path, data_dir: Path, branch: object = DefaultBranch()) -> ProjectContext:
    return ProjectContext("local", str(repo), GitWorktreeInputs(branch), str(data_dir))  # type: ignore[arg-type]


def member(provider: GitWorktreeProvider, repo: Path, data_dir: Path, branch: object = DefaultBranch()) -> Created:
    inputs = provider.member_inputs(context(repo, data_dir, branch), MEMBER_KEY)
    created = provider.create(
        CreateContext("local", str(repo), inputs, str(data_dir), path_key=MEMBER_KEY, cancelled=threading.Event())
    )
    assert isinstance(created, Created), created
    return created


def bind(provider: GitWorktreeProvider, repo: Path, data_dir: Path, created: Created, branch: object, key: str) -> dict:
    bound = provider.bind(
        BindContext(
            "local",
            str(repo),
            GitWorktreeInputs(branch),  # type: ignore[arg-type]
            str(data_dir),
            path=created.path,
            resource=created.resource,
            path_key=key,
        )
    )
    assert bound is not None
    return bound


def test_git_worktree_pools_and_the_others_do_not() -> None:
    from bb_environments.providers.personal_workspace import PersonalWorkspaceProvider
    from bb_environments.providers.project_checkout import ProjectCheckoutProvider

    assert can_pool(GitWorktreeProvider())
    assert not can_pool(ProjectCheckoutProvider()) and not can_pool(PersonalWorkspaceProvider())


def test_the_base_head_is_the_bases_commit_and_its_setup_scripts_content(
    git_repo: Path, git: Git, tmp_path: Path
) -> None:
    provider = GitWorktreeProvider()
    without_script = provider.base_head(context(git_repo, tmp_path / "data"))
    assert without_script.base_commit == git(git_repo, "rev-parse", "HEAD").strip()
    assert without_script.setup_hash is None

    (git_repo / ".bb-env-setup.sh").write_text("echo one\n")
    git(git_repo, "add", ".bb-env-setup.sh")
    git(git_repo, "commit", "-qm", "setup")
    with_script = provider.base_head(context(git_repo, tmp_path / "data"))
    assert with_script.setup_hash == hashlib.sha256(b"echo one").hexdigest()

    # An uncommitted change is not what a worktree gets: the head stays as it was.
    (git_repo / ".bb-env-setup.sh").write_text("echo two\n")
    assert provider.base_head(context(git_repo, tmp_path / "data")) == with_script

    git(git_repo, "branch", "other", "HEAD~1")
    on_other = provider.base_head(context(git_repo, tmp_path / "data", NewBranch(name="x", base="other")))
    assert on_other.base_commit == git(git_repo, "rev-parse", "other").strip() and on_other.setup_hash is None


def test_a_members_inputs_name_its_own_branch_and_an_existing_branch_cannot_be_pooled(
    git_repo: Path, tmp_path: Path
) -> None:
    provider = GitWorktreeProvider()
    new = provider.member_inputs(context(git_repo, tmp_path, NewBranch(name="feature", base="main")), MEMBER_KEY)
    assert new == GitWorktreeInputs(NewBranch(name=f"bb/{MEMBER_KEY}", base="main"))
    assert provider.member_inputs(context(git_repo, tmp_path), MEMBER_KEY) == GitWorktreeInputs(DefaultBranch())
    with pytest.raises(InvalidInputs, match="existing"):
        provider.member_inputs(context(git_repo, tmp_path, ExistingBranch(name="main")), MEMBER_KEY)


def test_binding_renames_the_members_branch_to_the_threads_once(git_repo: Path, git: Git, tmp_path: Path) -> None:
    provider = GitWorktreeProvider()
    data_dir = tmp_path / "data"
    created = member(provider, git_repo, data_dir)
    assert git(created.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == f"bb/{MEMBER_KEY}"

    asked = NewBranch(name="feature/pooled", base="main")
    assert bind(provider, git_repo, data_dir, created, asked, "t1") == {"branch": "feature/pooled"}
    assert git(created.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "feature/pooled"
    # Asked again after a crash: done already, nothing changes.
    assert bind(provider, git_repo, data_dir, created, asked, "t1") == {"branch": "feature/pooled"}
    assert f"bb/{MEMBER_KEY}" not in git(git_repo, "branch", "--list")


def test_a_default_branch_thread_gets_its_own_bb_branch(git_repo: Path, git: Git, tmp_path: Path) -> None:
    provider = GitWorktreeProvider()
    created = member(provider, git_repo, tmp_path / "data")
    assert bind(provider, git_repo, tmp_path / "data", created, DefaultBranch(), "t-7") == {"branch": "bb/t-7"}
    assert git(created.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "bb/t-7"


@pytest.mark.parametrize("name", ["taken", "-x", "a..b", "bad name"])
def test_a_rename_to_a_taken_or_bad_name_fails_and_changes_nothing(
    git_repo: Path, git: Git, tmp_path: Path, name: str
) -> None:
    provider = GitWorktreeProvider()
    created = member(provider, git_repo, tmp_path / "data")
    git(git_repo, "branch", "taken")
    with pytest.raises(BindFailed):
        provider.bind(
            BindContext(
                "local",
                str(git_repo),
                # Inputs as a hostile caller would make them: nothing decoded or checked them yet.
                GitWorktreeInputs(NewBranch(name=name, base="main")),
                str(tmp_path / "data"),
                path=created.path,
                resource=created.resource,
                path_key="t1",
            )
        )
    assert git(created.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == f"bb/{MEMBER_KEY}"


def test_a_member_no_thread_took_is_removed_with_its_branch_and_nothing_saved(
    git_repo: Path, git: Git, tmp_path: Path
) -> None:
    provider = GitWorktreeProvider()
    data_dir = tmp_path / "data"
    created = member(provider, git_repo, data_dir)
    (Path(created.path) / "setup-output.txt").write_text("made by the member's setup\n")
    removed = provider.remove(
        RemoveContext(
            "local",
            str(data_dir),
            str(git_repo),
            None,
            created.path,
            MEMBER_KEY,
            1,
            created.resource,
            unbound_member=True,
        )
    )
    assert removed == Removed()
    assert git(git_repo, "branch", "--list", "bb/*").strip() == ""
    assert git(git_repo, "for-each-ref", "refs/bb/saved").strip() == ""
    assert not Path(created.path).exists()
