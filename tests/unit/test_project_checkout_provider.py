import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from bb_environments.providers.contract import (
    READY,
    CreateContext,
    Created,
    CreateFailed,
    EnvironmentProvider,
    InvalidInputs,
    ProjectContext,
    RemoveContext,
    Removed,
)
from bb_environments.providers.git_commands import take_owed_post_checkout
from bb_environments.providers.project_checkout import (
    CurrentBranch,
    ExistingBranch,
    NewBranch,
    ProjectCheckoutInputs,
    ProjectCheckoutProvider,
)
from tests.conftest import RecordingReporter

Git = Callable[..., str]
Branch = CurrentBranch | ExistingBranch | NewBranch
DIRTY = "Checkout blocked by uncommitted changes"


@pytest.fixture
def provider() -> ProjectCheckoutProvider:
    return ProjectCheckoutProvider()


@pytest.fixture
def feature_repo(git_repo: Path, git: Git) -> Path:
    """`git_repo` plus a branch `feature` one commit ahead of `main`; `main` is checked out."""
    git(git_repo, "switch", "--quiet", "-c", "feature")
    (git_repo / "feature.txt").write_text("feature\n")
    git(git_repo, "add", "feature.txt")
    git(git_repo, "commit", "--quiet", "-m", "feature")
    git(git_repo, "switch", "--quiet", "main")
    return git_repo


def inputs(branch: Branch = CurrentBranch(), path: str | None = None) -> ProjectCheckoutInputs:
    return ProjectCheckoutInputs(branch=branch, path=path)


def project_context(
    project: Path, data_dir: Path, branch: Branch = CurrentBranch(), path: str | None = None
) -> ProjectContext:
    return ProjectContext("local", str(project), inputs(branch, path), str(data_dir))


def create_context(
    project: Path,
    data_dir: Path,
    branch: Branch = CurrentBranch(),
    path: str | None = None,
    cancelled: threading.Event | None = None,
    thread_id: str = "t1",
) -> CreateContext:
    return CreateContext(
        "local",
        str(project),
        inputs(branch, path),
        str(data_dir),
        thread_id=thread_id,
        path_key=thread_id,
        report=RecordingReporter(),
        cancelled=cancelled or threading.Event(),
    )


def refusal(
    provider: ProjectCheckoutProvider, project: Path, data_dir: Path, branch: Branch, path: str | None = None
) -> str:
    with pytest.raises(InvalidInputs) as refused:
        provider.validate(project_context(project, data_dir, branch, path))
    return str(refused.value)


def current_branch(git: Git, repo: Path) -> str:
    return git(repo, "rev-parse", "--abbrev-ref", "HEAD")


@contextmanager
def holding_checkout_lock(data_dir: Path, checkout: Path) -> Iterator[None]:
    lock_path = data_dir / "locks" / f"{hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def test_declaration_satisfies_the_contract(provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path) -> None:
    assert isinstance(provider, EnvironmentProvider)
    assert provider.requires.project_checkout
    assert provider.policy.retire_grace_ms is None
    assert provider.availability(project_context(git_repo, data_dir)) == READY


def test_inputs_default_to_the_current_branch_and_forbid_unknown_fields() -> None:
    assert msgspec.convert({}, ProjectCheckoutInputs) == ProjectCheckoutInputs(CurrentBranch(), None)
    decoded = msgspec.convert({"branch": {"kind": "new", "name": "x"}, "path": "src"}, ProjectCheckoutInputs)
    assert decoded == ProjectCheckoutInputs(NewBranch("x"), "src")
    for raw in ({"extra": 1}, {"branch": {"kind": "existing", "name": "x", "base": "y"}}, {"path": ""}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(raw, ProjectCheckoutInputs)


def test_current_branch_runs_in_the_checkout_without_owning_it(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path
) -> None:
    provider.validate(project_context(git_repo, data_dir))
    assert provider.planned_path(project_context(git_repo, data_dir), "t1") == str(git_repo.resolve())
    result = provider.create(create_context(git_repo, data_dir))
    assert result == Created(
        path=str(git_repo.resolve()), owns_path=False, merge_base_branch="main", resource={"branch": "main"}
    )


def test_current_branch_accepts_a_directory_that_is_not_git(
    provider: ProjectCheckoutProvider, tmp_path: Path, data_dir: Path
) -> None:
    project = tmp_path / "plain"
    project.mkdir()
    provider.validate(project_context(project, data_dir))
    result = provider.create(create_context(project, data_dir))
    assert result == Created(path=str(project.resolve()), owns_path=False, resource={"branch": None})


def test_current_branch_is_accepted_while_the_checkout_is_busy(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    git(git_repo, "switch", "--quiet", "--detach")
    (git_repo / "README.md").write_text("dirty\n")
    provider.validate(project_context(git_repo, data_dir))
    assert isinstance(provider.create(create_context(git_repo, data_dir)), Created)


def test_path_selects_a_directory_inside_the_project(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path
) -> None:
    (git_repo / "src" / "app").mkdir(parents=True)
    expected = str((git_repo / "src" / "app").resolve())
    for path in ("src/app", str(git_repo / "src" / "app"), "src/../src/app"):
        provider.validate(project_context(git_repo, data_dir, path=path))
        assert provider.planned_path(project_context(git_repo, data_dir, path=path), "t1") == expected
    result = provider.create(create_context(git_repo, data_dir, path="src/app"))
    assert isinstance(result, Created) and result.path == expected


def test_path_refuses_escapes_through_dot_dot_and_symlinks(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (git_repo / "link").symlink_to(outside)
    for path in ("../outside", "link", str(outside), "/"):
        assert refusal(provider, git_repo, data_dir, CurrentBranch(), path) == f"path: {path!r} is outside the project"
        with pytest.raises(InvalidInputs):
            provider.planned_path(project_context(git_repo, data_dir, path=path), "t1")
    assert isinstance(provider.create(create_context(git_repo, data_dir, path="link")), CreateFailed)


def test_path_must_be_an_existing_directory(provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path) -> None:
    assert "not a directory" in refusal(provider, git_repo, data_dir, CurrentBranch(), "README.md")
    assert "not a directory" in refusal(provider, git_repo, data_dir, CurrentBranch(), "missing")


def test_validate_refuses_a_missing_project(provider: ProjectCheckoutProvider, tmp_path: Path, data_dir: Path) -> None:
    assert "does not exist" in refusal(provider, tmp_path / "gone", data_dir, CurrentBranch())


def test_switching_to_an_existing_branch(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    provider.validate(project_context(feature_repo, data_dir, ExistingBranch("feature")))
    ctx = create_context(feature_repo, data_dir, ExistingBranch("feature"))
    result = provider.create(ctx)
    assert result == Created(
        path=str(feature_repo.resolve()), owns_path=False, merge_base_branch="main", resource={"branch": "feature"}
    )
    assert current_branch(git, feature_repo) == "feature"
    assert ctx.report.steps == ["Switching to branch feature"]
    assert ctx.report.logs == ["Switched to branch feature"]


def test_with_git_hooks_run_a_switch_owes_the_post_checkout_hook_with_gits_arguments_to_its_setup_once(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = feature_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    monkeypatch.setenv("BB_GIT_HOOKS", "run")
    ctx = replace(create_context(feature_repo, data_dir, ExistingBranch("feature")), environment_id="env-1")

    provider.create(ctx)

    assert take_owed_post_checkout(feature_repo, "env-2") is None  # another environment's: dropped
    provider.create(replace(ctx, inputs=inputs(ExistingBranch("main"))))
    provider.create(ctx)
    owed = take_owed_post_checkout(feature_repo, "env-1")
    assert owed == [str(hook), git(feature_repo, "rev-parse", "main"), git(feature_repo, "rev-parse", "feature"), "1"]
    assert take_owed_post_checkout(feature_repo, "env-1") is None


def test_without_git_hooks_run_a_switch_owes_no_hook(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path
) -> None:
    hook = feature_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    provider.create(replace(create_context(feature_repo, data_dir, ExistingBranch("feature")), environment_id="env-1"))
    assert take_owed_post_checkout(feature_repo, "env-1") is None


def test_switching_again_to_the_same_branch_is_a_no_op(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    git(feature_repo, "switch", "--quiet", "feature")
    (feature_repo / "README.md").write_text("dirty but already there\n")
    provider.validate(project_context(feature_repo, data_dir, ExistingBranch("feature")))
    ctx = create_context(feature_repo, data_dir, ExistingBranch("feature"))
    assert isinstance(provider.create(ctx), Created)
    assert ctx.report.steps == ["Already on branch feature"]


def test_creating_a_new_branch_from_head(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    head = git(git_repo, "rev-parse", "HEAD")
    provider.validate(project_context(git_repo, data_dir, NewBranch("topic")))
    ctx = create_context(git_repo, data_dir, NewBranch("topic"))
    result = provider.create(ctx)
    assert result == Created(
        path=str(git_repo.resolve()), owns_path=False, merge_base_branch="main", resource={"branch": "topic"}
    )
    assert current_branch(git, git_repo) == "topic"
    assert git(git_repo, "rev-parse", "topic") == head
    assert ctx.report.steps == ["Creating branch topic from HEAD"]
    # A re-run (after a crash, say) finds the branch already checked out.
    again = create_context(git_repo, data_dir, NewBranch("topic"))
    rerun = provider.create(again)
    assert isinstance(rerun, Created) and (rerun.path, rerun.resource) == (result.path, result.resource)
    assert again.report.steps == ["Already on branch topic"]


@pytest.mark.parametrize("branch", [NewBranch("topic.v2"), ExistingBranch("feature")], ids=["new", "existing"])
def test_a_create_rerun_after_a_kill_reports_the_branch_it_switched_from(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, branch: Branch
) -> None:
    first = provider.create(create_context(feature_repo, data_dir, branch))
    # Killed before Created was recorded: the core runs the same create again.
    again = create_context(feature_repo, data_dir, branch)
    rerun = provider.create(again)

    assert isinstance(first, Created) and first.merge_base_branch == "main"
    assert isinstance(rerun, Created) and rerun.merge_base_branch == "main"
    assert again.report.steps == [f"Already on branch {branch.name}"]


def test_a_switch_git_refuses_leaves_no_note_in_the_repository_config(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    (feature_repo / "feature.txt").write_text("untracked here, tracked on feature\n")
    refused = provider.create(create_context(feature_repo, data_dir, ExistingBranch("feature")))
    assert not isinstance(refused, Created), refused
    assert refused.message == "The following untracked working tree files would be overwritten by checkout: feature.txt"
    assert current_branch(git, feature_repo) == "main"
    assert "bbswitched" not in git(feature_repo, "config", "--list").lower()


def test_a_repository_config_locked_by_another_git_is_a_transient_failure(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    (feature_repo / ".git" / "config.lock").touch()  # another git writing the config just now
    refused = provider.create(create_context(feature_repo, data_dir, ExistingBranch("feature")))
    assert isinstance(refused, CreateFailed) and refused.failure == "transient", refused
    assert current_branch(git, feature_repo) == "main"


def test_one_threads_switch_is_not_the_merge_base_of_another_thread_joining_the_branch(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path
) -> None:
    provider.create(create_context(feature_repo, data_dir, ExistingBranch("feature"), thread_id="t1"))
    other = provider.create(create_context(feature_repo, data_dir, ExistingBranch("feature"), thread_id="t2"))
    assert isinstance(other, Created) and other.merge_base_branch == "feature"


def test_creating_a_new_branch_from_a_base(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    result = provider.create(create_context(feature_repo, data_dir, NewBranch("topic", base="feature")))
    assert isinstance(result, Created) and result.merge_base_branch == "feature"
    assert git(feature_repo, "rev-parse", "topic") == git(feature_repo, "rev-parse", "feature")
    assert current_branch(git, feature_repo) == "topic"


def test_refuses_a_detached_head(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    git(feature_repo, "switch", "--quiet", "--detach")
    refused = refusal(provider, feature_repo, data_dir, ExistingBranch("feature"))
    assert refused == "Checkout blocked while HEAD is detached"


def test_refuses_before_the_first_commit(
    provider: ProjectCheckoutProvider, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=main")
    assert refusal(provider, repo, data_dir, NewBranch("topic")) == "Checkout blocked before the first commit"


def test_refuses_unresolved_conflicts(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    (feature_repo / "feature.txt").write_text("main's version\n")
    git(feature_repo, "add", "feature.txt")
    git(feature_repo, "commit", "--quiet", "-m", "clash")
    with pytest.raises(subprocess.CalledProcessError):
        git(feature_repo, "merge", "--quiet", "feature")
    assert refusal(provider, feature_repo, data_dir, NewBranch("topic")) == "Checkout blocked by unresolved conflicts"


def test_refuses_a_merge_in_progress(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    git(feature_repo, "merge", "--quiet", "--no-ff", "--no-commit", "feature")
    assert refusal(provider, feature_repo, data_dir, NewBranch("topic")) == "Checkout blocked by an in-progress merge"


def test_refuses_a_rebase_in_progress(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    git(feature_repo, "switch", "--quiet", "feature")
    git(feature_repo, "-c", "sequence.editor=sed -i s/^pick/edit/", "rebase", "--quiet", "-i", "main")
    refused = refusal(provider, feature_repo, data_dir, ExistingBranch("main"))
    assert refused == "Checkout blocked by an in-progress rebase"


def test_refuses_uncommitted_changes_but_not_untracked_files(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    (feature_repo / "untracked.txt").write_text("new\n")
    provider.validate(project_context(feature_repo, data_dir, ExistingBranch("feature")))
    (feature_repo / "README.md").write_text("modified\n")
    assert refusal(provider, feature_repo, data_dir, ExistingBranch("feature")) == DIRTY
    git(feature_repo, "checkout", "--", "README.md")
    git(feature_repo, "add", "untracked.txt")
    assert refusal(provider, feature_repo, data_dir, ExistingBranch("feature")) == DIRTY
    assert current_branch(git, feature_repo) == "main"


def test_refuses_missing_and_already_existing_branches(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path
) -> None:
    assert refusal(provider, feature_repo, data_dir, ExistingBranch("nope")) == "branch.name: no branch 'nope'"
    refused = refusal(provider, feature_repo, data_dir, NewBranch("feature"))
    assert refused == "branch.name: branch 'feature' already exists"
    refused = refusal(provider, feature_repo, data_dir, NewBranch("topic", base="nope"))
    assert refused == "branch.base: 'nope' is not a commit"


def test_refuses_branch_names_that_git_could_read_as_options(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path
) -> None:
    assert refusal(provider, git_repo, data_dir, ExistingBranch("--orphan")).startswith("branch.name: '--orphan'")
    assert refusal(provider, git_repo, data_dir, NewBranch("ok", base="-f")).startswith("branch.base: '-f'")


def test_a_new_branch_starts_at_any_commit_ish_and_a_full_branch_ref_names_the_branch(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    main = git(feature_repo, "rev-parse", "main")
    new = msgspec.convert(
        {"branch": {"kind": "new", "name": "refs/heads/topic", "base": "feature~1"}}, ProjectCheckoutInputs
    )
    assert new.branch == NewBranch("topic", base="feature~1")

    provider.validate(project_context(feature_repo, data_dir, new.branch))
    assert isinstance(provider.create(create_context(feature_repo, data_dir, new.branch)), Created)
    assert (current_branch(git, feature_repo), git(feature_repo, "rev-parse", "topic")) == ("topic", main)

    existing = msgspec.convert({"branch": {"kind": "existing", "name": "refs/heads/feature"}}, ProjectCheckoutInputs)
    assert isinstance(provider.create(create_context(feature_repo, data_dir, existing.branch)), Created)
    assert current_branch(git, feature_repo) == "feature"
    assert "refs/heads/topic" not in git(feature_repo, "branch", "--list")
    refused = refusal(provider, feature_repo, data_dir, ExistingBranch("refs/remotes/origin/main"))
    assert refused.startswith(
        "branch.name: 'refs/remotes/origin/main' is not a valid branch name: it starts with 'refs/'"
    )


def test_refuses_a_switch_outside_git(provider: ProjectCheckoutProvider, tmp_path: Path, data_dir: Path) -> None:
    project = tmp_path / "plain"
    project.mkdir()
    assert "is not a git checkout" in refusal(provider, project, data_dir, ExistingBranch("main"))


def test_create_rechecks_what_changed_since_validation(
    provider: ProjectCheckoutProvider, feature_repo: Path, data_dir: Path, git: Git
) -> None:
    provider.validate(project_context(feature_repo, data_dir, ExistingBranch("feature")))
    (feature_repo / "README.md").write_text("edited meanwhile\n")
    result = provider.create(create_context(feature_repo, data_dir, ExistingBranch("feature")))
    assert result == CreateFailed("terminal", DIRTY)
    assert current_branch(git, feature_repo) == "main"


def test_remove_leaves_the_checkout_and_its_branch_alone(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    created = provider.create(create_context(git_repo, data_dir, NewBranch("topic")))
    assert isinstance(created, Created)
    remove_context = RemoveContext(
        "local", str(data_dir), str(git_repo), inputs(NewBranch("topic")), created.path, "t1", 1, created.resource
    )
    assert provider.remove(remove_context) == Removed()
    assert current_branch(git, git_repo) == "topic"
    assert (git_repo / "README.md").read_text() == "hello\n"


def test_concurrent_switches_of_one_checkout_run_one_at_a_time(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path, git: Git, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A git ahead of the real one on PATH journals each `git switch`; overlapping switches would
    # interleave its lines. (Not a post-checkout hook: our git runs none.)
    journal = git_repo.parent / "switches.log"
    wrapper = git_repo.parent / "journaling-git" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(f"""#!/bin/sh
case " $* " in *" switch "*) echo start >> '{journal}'; '{shutil.which("git")}' "$@"; status=$?
    sleep 0.3; echo end >> '{journal}'; exit $status;; esac
exec '{shutil.which("git")}' "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    contexts = [create_context(git_repo, data_dir, NewBranch(name)) for name in ("one", "two")]
    results: list[object] = [None, None]

    def create(index: int) -> None:
        results[index] = provider.create(contexts[index])

    with holding_checkout_lock(data_dir, git_repo):
        workers = [threading.Thread(target=create, args=(index,)) for index in range(2)]
        for worker in workers:
            worker.start()
        for context in contexts:
            while "Waiting for another branch switch in this checkout to finish" not in context.report.steps:
                threading.Event().wait(0.01)
        assert current_branch(git, git_repo) == "main"
    for worker in workers:
        worker.join(timeout=10)
    assert all(isinstance(result, Created) for result in results)
    assert journal.read_text().split() == ["start", "end", "start", "end"]
    assert current_branch(git, git_repo) in ("one", "two")


def test_cancel_while_waiting_for_the_checkout_lock(
    provider: ProjectCheckoutProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    cancelled = threading.Event()
    context = create_context(git_repo, data_dir, NewBranch("topic"), cancelled=cancelled)
    with holding_checkout_lock(data_dir, git_repo):
        cancelled.set()
        assert provider.create(context) == CreateFailed("terminal", "cancelled")
    assert current_branch(git, git_repo) == "main"
