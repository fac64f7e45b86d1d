import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
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
    RemoveFailed,
)
from bb_environments.providers.git_worktree import (
    DefaultBranch,
    ExistingBranch,
    GitWorktreeInputs,
    GitWorktreeProvider,
    NewBranch,
    repo_dir_name,
)
from tests.conftest import RecordingReporter

Git = Callable[..., str]
Branch = DefaultBranch | ExistingBranch | NewBranch
PATH_KEY = "thread-1"
ENVIRONMENT_ID = "0b7e4c1a-5d2f-4e8b-9a3c-1f2e3d4c5b6a"


@pytest.fixture
def provider() -> GitWorktreeProvider:
    return GitWorktreeProvider()


def project_context(repo: Path, data_dir: Path, branch: Branch = DefaultBranch()) -> ProjectContext:
    return ProjectContext("local", str(repo), GitWorktreeInputs(branch), str(data_dir))


def create_context(
    repo: Path,
    data_dir: Path,
    branch: Branch = DefaultBranch(),
    path_key: str = PATH_KEY,
    cancelled: threading.Event | None = None,
) -> CreateContext:
    return CreateContext(
        "local",
        str(repo),
        GitWorktreeInputs(branch),
        str(data_dir),
        thread_id="t1",
        path_key=path_key,
        report=RecordingReporter(),
        cancelled=cancelled or threading.Event(),
    )


def remove_context(
    repo: Path, data_dir: Path, path: str | None, resource: dict | None = None, path_key: str = PATH_KEY
) -> RemoveContext:
    return RemoveContext("local", str(data_dir), str(repo), None, path, path_key, 1, resource, ENVIRONMENT_ID)


def create(provider: GitWorktreeProvider, repo: Path, data_dir: Path, branch: Branch = DefaultBranch()) -> Created:
    result = provider.create(create_context(repo, data_dir, branch))
    assert isinstance(result, Created), result
    return result


def worktree_paths(git: Git, repo: Path) -> list[str]:
    listing = git(repo, "worktree", "list", "--porcelain")
    return [line.removeprefix("worktree ") for line in listing.splitlines() if line.startswith("worktree ")]


def branches(git: Git, repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").splitlines()


def current_branch(git: Git, worktree: str | Path) -> str:
    return git(Path(worktree), "symbolic-ref", "--short", "HEAD")


def test_satisfies_the_provider_contract(provider: GitWorktreeProvider, git_repo: Path, data_dir: Path) -> None:
    assert isinstance(provider, EnvironmentProvider)
    assert provider.availability(project_context(git_repo, data_dir)) == READY
    raw = {"branch": {"kind": "new", "name": "feature", "base": "main"}}
    assert msgspec.convert(raw, provider.inputs_type) == GitWorktreeInputs(NewBranch("feature", "main"))
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"branch": {"kind": "default"}, "extra": 1}, provider.inputs_type)


@pytest.mark.parametrize(
    "branch",
    [
        *(ExistingBranch(name) for name in ["--upload-pack=x", "../x", "a..b", "has space", "x.lock", ""]),
        *(NewBranch(name) for name in ["a/.b", "a//b", "x@{1}", "--upload-pack=x"]),
        NewBranch("fine", base="--upload-pack=x"),
        NewBranch("fine", base="../x"),
    ],
)
def test_hostile_branch_names_are_refused_and_nothing_is_created(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git, branch: Branch
) -> None:
    branches_before = branches(git, git_repo)

    with pytest.raises(InvalidInputs):
        provider.validate(project_context(git_repo, data_dir, branch))
    result = provider.create(create_context(git_repo, data_dir, branch))

    assert isinstance(result, CreateFailed) and result.failure == "terminal"
    assert branches(git, git_repo) == branches_before
    assert worktree_paths(git, git_repo) == [str(git_repo)]
    assert list(data_dir.iterdir()) == []


def test_validate_refuses_a_directory_that_is_not_a_repository(
    provider: GitWorktreeProvider, tmp_path: Path, data_dir: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidInputs, match="is not a git repository"):
        provider.validate(project_context(plain, data_dir))


def test_validate_refuses_a_repository_without_commits(
    provider: GitWorktreeProvider, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "--quiet")
    with pytest.raises(InvalidInputs, match="has no commits yet"):
        provider.validate(project_context(empty, data_dir))


def test_a_repository_made_anew_is_checked_again(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    provider.validate(project_context(git_repo, data_dir))
    shutil.rmtree(git_repo / ".git")
    with pytest.raises(InvalidInputs, match="is not a git repository"):
        provider.validate(project_context(git_repo, data_dir))
    git(git_repo, "init", "--quiet")
    with pytest.raises(InvalidInputs, match="no commits yet|cannot determine the default branch"):
        provider.validate(project_context(git_repo, data_dir))


def test_validate_refuses_a_missing_existing_branch(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path
) -> None:
    with pytest.raises(InvalidInputs, match=r"branch.name: no branch 'nope' in "):
        provider.validate(project_context(git_repo, data_dir, ExistingBranch("nope")))


def test_validate_refuses_a_new_branch_that_already_exists(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    git(git_repo, "branch", "taken")
    with pytest.raises(InvalidInputs, match="'taken' already exists"):
        provider.validate(project_context(git_repo, data_dir, NewBranch("taken")))


def test_validate_refuses_a_base_that_is_not_a_commit(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path
) -> None:
    with pytest.raises(InvalidInputs, match="branch.base: 'nowhere' is not a commit"):
        provider.validate(project_context(git_repo, data_dir, NewBranch("feature", base="nowhere")))


def test_validate_refuses_the_branch_of_the_project_checkout(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path
) -> None:
    with pytest.raises(InvalidInputs, match="'main' is checked out in the project checkout"):
        provider.validate(project_context(git_repo, data_dir, ExistingBranch("main")))


def test_validate_accepts_good_inputs_without_changing_anything(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    git(git_repo, "branch", "existing")
    for branch in [DefaultBranch(), ExistingBranch("existing"), NewBranch("feature", base="existing")]:
        provider.validate(project_context(git_repo, data_dir, branch))
    assert sorted(branches(git, git_repo)) == ["existing", "main"]
    assert list(data_dir.iterdir()) == []


def test_create_default_makes_a_bb_branch_from_the_default_branch(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    planned = provider.planned_path(project_context(git_repo, data_dir), PATH_KEY)

    created = create(provider, git_repo, data_dir)

    assert created.path == planned == str(data_dir / "worktrees" / PATH_KEY / "repo")
    assert (created.owns_path, created.merge_base_branch) == (True, "main")
    assert created.resource == {"branch": "bb/thread-1"}
    assert current_branch(git, created.path) == "bb/thread-1"
    assert created.path in worktree_paths(git, git_repo)


def test_create_default_prefers_origin_head(
    provider: GitWorktreeProvider, git_repo: Path, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "--quiet", str(git_repo), str(clone))

    created = create(provider, clone, data_dir)

    assert created.merge_base_branch == "origin/main"
    assert git(clone, "rev-parse", "bb/thread-1") == git(clone, "rev-parse", "origin/main")
    tracking = subprocess.run(["git", "-C", str(clone), "config", "branch.bb/thread-1.merge"])
    assert tracking.returncode == 1  # no upstream: the thread's branch must not push to main


@pytest.mark.parametrize(
    ("branches_to_keep", "checked_out", "expected"),
    [(["master", "trunk"], "trunk", "master"), (["trunk", "other"], "trunk", "trunk")],
)
def test_create_default_without_origin_takes_master_else_the_checked_out_branch(
    provider: GitWorktreeProvider,
    git_repo: Path,
    data_dir: Path,
    git: Git,
    branches_to_keep: list[str],
    checked_out: str,
    expected: str,
) -> None:
    for name in branches_to_keep:
        git(git_repo, "branch", name)
    git(git_repo, "checkout", "--quiet", checked_out)
    git(git_repo, "branch", "-D", "main")

    assert create(provider, git_repo, data_dir).merge_base_branch == expected


def test_a_default_branch_found_once_is_found_again_after_its_refs_change(
    provider: GitWorktreeProvider, git_repo: Path, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    assert create(provider, git_repo, data_dir).merge_base_branch == "main"
    git(git_repo, "checkout", "--quiet", "-b", "master")
    git(git_repo, "branch", "-D", "main")
    provider.validate(project_context(git_repo, data_dir))

    assert provider.create(create_context(git_repo, data_dir, path_key="thread-2")).merge_base_branch == "master"

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "--quiet", str(git_repo), str(clone))
    git(clone, "remote", "set-head", "origin", "--delete")
    assert provider.create(create_context(clone, data_dir, path_key="thread-3")).merge_base_branch == "master"
    git(clone, "checkout", "--quiet", "-b", "trunk")
    git(clone, "push", "--quiet", "origin", "trunk")
    git(clone, "remote", "set-head", "origin", "trunk")

    assert provider.create(create_context(clone, data_dir, path_key="thread-4")).merge_base_branch == "origin/trunk"


def test_create_default_passes_over_an_origin_head_that_points_nowhere(
    provider: GitWorktreeProvider, git_repo: Path, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "--quiet", str(git_repo), str(clone))
    git(clone, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/gone")

    assert create(provider, clone, data_dir).merge_base_branch == "main"


def test_create_new_branches_from_the_given_base(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    base_commit = git(git_repo, "rev-parse", "HEAD")
    git(git_repo, "branch", "release")
    git(git_repo, "commit", "--quiet", "--allow-empty", "-m", "later on main")

    created = create(provider, git_repo, data_dir, NewBranch("feature", base="release"))

    assert created.merge_base_branch == "release"
    assert current_branch(git, created.path) == "feature"
    assert git(git_repo, "rev-parse", "feature") == base_commit


@pytest.mark.parametrize("base", ["main~1", "HEAD^", "{sha}", "{short_sha}"])
def test_a_new_branch_starts_at_any_commit_ish(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git, base: str
) -> None:
    first = git(git_repo, "rev-parse", "HEAD")
    git(git_repo, "commit", "--quiet", "--allow-empty", "-m", "second")
    branch = NewBranch("feature", base=base.format(sha=first, short_sha=first[:9]))

    provider.validate(project_context(git_repo, data_dir, branch))
    create(provider, git_repo, data_dir, branch)

    assert git(git_repo, "rev-parse", "feature") == first


def test_a_full_branch_ref_names_the_branch_itself_and_other_refs_are_refused(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    git(git_repo, "branch", "existing")
    for raw, expected in [
        ({"kind": "existing", "name": "refs/heads/existing"}, "existing"),
        ({"kind": "new", "name": "refs/heads/fresh"}, "fresh"),
    ]:
        branch = msgspec.convert({"branch": raw}, GitWorktreeInputs).branch
        provider.validate(project_context(git_repo, data_dir, branch))
        created = provider.create(create_context(git_repo, data_dir, branch, path_key=expected))
        assert isinstance(created, Created) and current_branch(git, created.path) == expected
    assert sorted(branches(git, git_repo)) == ["existing", "fresh", "main"]
    with pytest.raises(
        InvalidInputs, match="branch.name: 'refs/tags/v1' is not a valid branch name: it starts with 'refs/'"
    ):
        provider.validate(project_context(git_repo, data_dir, NewBranch("refs/tags/v1")))


def test_create_existing_checks_out_the_branch(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    git(git_repo, "branch", "existing")

    created = create(provider, git_repo, data_dir, ExistingBranch("existing"))

    assert (created.owns_path, created.merge_base_branch) == (True, "main")
    assert current_branch(git, created.path) == "existing"


def test_existing_branch_in_another_worktree_is_adopted_and_kept_on_remove(
    provider: GitWorktreeProvider, git_repo: Path, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    elsewhere = tmp_path / "elsewhere"
    git(git_repo, "worktree", "add", "--quiet", "-b", "shared", str(elsewhere))
    branch = ExistingBranch("shared")

    planned = provider.planned_path(project_context(git_repo, data_dir, branch), PATH_KEY)
    created = create(provider, git_repo, data_dir, branch)
    removed = provider.remove(remove_context(git_repo, data_dir, created.path, created.resource))

    assert planned == created.path == str(elsewhere)
    assert (created.owns_path, created.resource) == (False, {"adopted": True})
    assert created.merge_base_branch == "main"
    assert removed == Removed()
    assert elsewhere.is_dir() and str(elsewhere) in worktree_paths(git, git_repo)
    assert "shared" in branches(git, git_repo)


def test_a_thread_asking_for_a_branch_another_worktree_has_joins_whoever_works_there(
    provider: GitWorktreeProvider, git_repo: Path, tmp_path: Path, data_dir: Path, git: Git
) -> None:
    git(git_repo, "worktree", "add", "--quiet", "-b", "shared", str(tmp_path / "elsewhere"))
    git(git_repo, "branch", "free")

    def shares(branch: Branch) -> bool:
        return provider.shares_planned_path(project_context(git_repo, data_dir, branch))

    assert shares(ExistingBranch("shared"))
    assert not any(map(shares, [ExistingBranch("free"), NewBranch("fresh"), DefaultBranch()]))


def test_create_is_idempotent(provider: GitWorktreeProvider, git_repo: Path, data_dir: Path) -> None:
    first = create(provider, git_repo, data_dir, NewBranch("feature"))
    (Path(first.path) / "work-in-progress.txt").write_text("keep me")

    second = create(provider, git_repo, data_dir, NewBranch("feature"))

    assert second == first
    assert (Path(first.path) / "work-in-progress.txt").read_text() == "keep me"


def test_create_reuses_its_branch_when_the_worktree_is_gone(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    first = create(provider, git_repo, data_dir)
    git(Path(first.path), "commit", "--quiet", "--allow-empty", "-m", "thread work")
    work_commit = git(git_repo, "rev-parse", "bb/thread-1")
    git(git_repo, "worktree", "remove", "--force", first.path)

    second = create(provider, git_repo, data_dir)

    assert second.path == first.path
    assert git(Path(second.path), "rev-parse", "HEAD") == work_commit


def test_create_replaces_a_registered_worktree_whose_directory_is_gone(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    """git refuses to add a worktree at such a path, after it made the new branch: that branch is
    then taken as it is."""
    target = data_dir / "worktrees" / PATH_KEY / "repo"
    git(git_repo, "worktree", "add", "--quiet", "-b", "other", str(target))
    shutil.rmtree(target)

    created = create(provider, git_repo, data_dir)

    assert created.path == str(target)
    assert current_branch(git, target) == "bb/thread-1"
    assert git(git_repo, "rev-parse", "bb/thread-1") == git(git_repo, "rev-parse", "main")
    assert str(target) in worktree_paths(git, git_repo)


@pytest.mark.parametrize("leftover", ["plain directory", "worktree on another branch"])
def test_create_replaces_a_stale_target(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git, leftover: str
) -> None:
    target = data_dir / "worktrees" / PATH_KEY / "repo"
    if leftover == "plain directory":
        target.mkdir(parents=True)
        (target / "junk").write_text("junk")
    else:
        git(git_repo, "worktree", "add", "--quiet", "-b", "other", str(target))

    created = create(provider, git_repo, data_dir)

    assert created.path == str(target)
    assert current_branch(git, target) == "bb/thread-1"
    assert not (target / "junk").exists()


def test_create_makes_again_a_worktree_whose_checkout_was_cut_short(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    """What a `git worktree add` killed mid-checkout leaves (the host went down with the service):
    the worktree on its branch, still locked by git as being made, half its files missing."""
    target = data_dir / "worktrees" / PATH_KEY / "repo"
    git(git_repo, "worktree", "add", "--quiet", "-b", "bb/thread-1", str(target))
    Path(git(target, "rev-parse", "--git-dir"), "locked").write_text("initializing")
    (target / "README.md").unlink()

    created = create(provider, git_repo, data_dir)

    assert created.path == str(target)
    assert (target / "README.md").read_text() == "hello\n"
    assert "locked" not in git(git_repo, "worktree", "list", "--porcelain")


def test_create_stops_the_worktree_add_an_earlier_attempt_left_running_and_makes_the_worktree_again(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git, tmp_path: Path
) -> None:
    """A service killed during a checkout leaves its git running, to delete the worktree once its
    checkout is done; it must be stopped with no chance to clean up, and the worktree made again."""
    hold, checkouts = tmp_path / "hold", tmp_path / "checkouts"
    (git_repo / ".gitattributes").write_text("slow.txt filter=slow\n")
    (git_repo / "slow.txt").write_text("smudged\n")
    git(git_repo, "add", ".")
    git(git_repo, "commit", "--quiet", "-m", "a file checked out through a filter that can be held")
    git(
        git_repo,
        "config",
        "filter.slow.smudge",
        f"echo started >> {checkouts}; while [ -e {hold} ]; do sleep 0.02; done; cat",
    )
    hold.touch()
    target = data_dir / "worktrees" / PATH_KEY / "repo"
    left_running = subprocess.Popen(
        ["git", "-C", str(git_repo), "worktree", "add", "--no-track", "-b", "bb/thread-1", "--", str(target), "main"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    results: list[object] = []
    creating = threading.Thread(target=lambda: results.append(provider.create(create_context(git_repo, data_dir))))
    try:
        wait_until(lambda: lines(checkouts) == 1, "the first checkout's start")
        creating.start()
        wait_until(lambda: lines(checkouts) == 2, "the second checkout's start")
    finally:
        hold.unlink(missing_ok=True)
        if creating.is_alive():
            creating.join(timeout=60)
        left_running.kill()
        left_running.communicate()

    assert left_running.returncode == -9
    assert results == [
        Created(path=str(target), owns_path=True, merge_base_branch="main", resource={"branch": "bb/thread-1"})
    ]
    assert (target / "slow.txt").read_text() == "smudged\n"
    assert "locked" not in git(git_repo, "worktree", "list", "--porcelain")


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.02)


def test_create_copies_worktreeinclude_files(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    (git_repo / ".gitignore").write_text(".env\n")
    (git_repo / ".worktreeinclude").write_text(".env\n")
    git(git_repo, "add", ".gitignore", ".worktreeinclude")
    git(git_repo, "commit", "--quiet", "-m", "ignore .env")
    (git_repo / ".env").write_text("SECRET=1\n")
    context = create_context(git_repo, data_dir)

    created = provider.create(context)

    assert isinstance(created, Created)
    assert (Path(created.path) / ".env").read_text() == "SECRET=1\n"
    assert "Copying .worktreeinclude files" in context.report.steps
    assert ".env" in context.report.logs


def test_create_stops_when_cancelled(provider: GitWorktreeProvider, git_repo: Path, data_dir: Path) -> None:
    cancelled = threading.Event()
    cancelled.set()

    result = provider.create(create_context(git_repo, data_dir, cancelled=cancelled))

    assert result == CreateFailed("terminal", "cancelled")


def test_remove_kills_processes_and_keeps_the_branch(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    created = create(provider, git_repo, data_dir)
    sleeper = subprocess.Popen(["sleep", "60"], cwd=created.path)
    try:
        removed = provider.remove(remove_context(git_repo, data_dir, created.path, created.resource))
        assert sleeper.wait(timeout=5) != 0
    finally:
        sleeper.kill()

    assert removed == Removed()
    assert not os.path.exists(created.path)
    assert not (data_dir / "worktrees" / PATH_KEY).exists()
    assert worktree_paths(git, git_repo) == [str(git_repo)]
    assert "bb/thread-1" in branches(git, git_repo)


def test_remove_without_a_path_removes_everything_under_the_path_key(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git
) -> None:
    created = create(provider, git_repo, data_dir)
    stray = data_dir / "worktrees" / PATH_KEY / "half-made"
    stray.mkdir()

    removed = provider.remove(remove_context(git_repo, data_dir, None))

    assert removed == Removed()
    assert not (data_dir / "worktrees" / PATH_KEY).exists()
    assert created.path not in worktree_paths(git, git_repo)


def test_remove_twice_succeeds_both_times(provider: GitWorktreeProvider, git_repo: Path, data_dir: Path) -> None:
    created = create(provider, git_repo, data_dir)
    context = remove_context(git_repo, data_dir, created.path, created.resource)

    assert provider.remove(context) == Removed()
    assert provider.remove(context) == Removed()


def test_remove_unregisters_only_its_own_worktree_never_prunes_others(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, git: Git, tmp_path: Path
) -> None:
    created = create(provider, git_repo, data_dir)
    # Someone else's worktree whose directory is missing right now (say, `git worktree add`
    # is creating it): a global `git worktree prune` would delete its registration.
    other = tmp_path / "someone-elses"
    git(git_repo, "worktree", "add", "--quiet", "-b", "other", str(other))
    subprocess.run(["rm", "-rf", str(other), created.path], check=True)  # ours went missing too

    assert provider.remove(remove_context(git_repo, data_dir, created.path, created.resource)) == Removed()

    assert worktree_paths(git, git_repo) == [str(git_repo), str(other)]


def test_remove_refuses_a_path_outside_the_worktrees_root(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    sneaky = data_dir / "worktrees" / PATH_KEY / ".." / ".." / ".." / "precious"

    for path in (outside, sneaky, git_repo):
        result = provider.remove(remove_context(git_repo, data_dir, str(path)))
        assert isinstance(result, RemoveFailed) and "not inside" in result.message

    assert outside.is_dir() and (git_repo / "README.md").exists()


@pytest.mark.parametrize("path_key", ["", "..", ".hidden", "a/b", "-x", "x" * 129])
def test_unsafe_path_keys_are_refused(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, path_key: str
) -> None:
    with pytest.raises(ValueError, match="path key"):
        provider.planned_path(project_context(git_repo, data_dir), path_key)
    result = provider.create(create_context(git_repo, data_dir, path_key=path_key))
    assert isinstance(result, CreateFailed) and "path key" in result.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/src/my-repo", "my-repo"),
        ("/src/Repo With Space", "Repo-With-Space"),
        ("/src/.dotted", "dotted"),
        ("/src/-dash", "dash"),
        ("/src/日本", "repo"),
        ("/src/repo/", "repo"),
    ],
)
def test_repo_dir_name_is_a_safe_segment(source: str, expected: str) -> None:
    assert repo_dir_name(source) == expected


def test_a_locked_ref_is_a_transient_failure(provider: GitWorktreeProvider, git_repo: Path, data_dir: Path) -> None:
    ref_lock = git_repo / ".git" / "refs" / "heads" / "bb" / "thread-1.lock"
    ref_lock.parent.mkdir(parents=True)
    ref_lock.touch()

    result = provider.create(create_context(git_repo, data_dir))

    assert isinstance(result, CreateFailed) and result.failure == "transient", result
    assert "\n" not in result.message


def test_the_repository_git_hooks_do_not_run_in_our_git_commands(
    provider: GitWorktreeProvider, git_repo: Path, data_dir: Path, tmp_path: Path
) -> None:
    """A planted post-checkout would run at `worktree add`, as the service's user and outside any
    hook supervision (SPEC 9): bb's git runs with no hooks path."""
    marker = tmp_path / "post-checkout-ran"
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)

    result = create(provider, git_repo, data_dir)

    assert Path(result.path, ".git").exists()
    assert not marker.exists()
    subprocess.run(["git", "-C", str(git_repo), "checkout", "-q", "-b", "by-hand"], check=True)
    assert marker.exists()  # the user's own git still runs it
