"""Warm pools of the modal-sandbox provider (SPEC 10) against the fake at the modal SDK boundary:
each sandbox's files are a real directory where the clone and the setup run for real, and the
origin is a real `git daemon` on 127.0.0.1."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bb_environments.providers.contract import (
    BaseUnknown,
    BindContext,
    BindFailed,
    CreateContext,
    Created,
    InvalidInputs,
    PlanRefused,
    ProjectContext,
    can_pool,
)
from bb_environments.providers.git_repository import setup_hash_at
from bb_environments.providers.modal_pool import BOUND_TAG, ORIGIN_HEAD_FRESH_S, OriginHeads
from bb_environments.providers.modal_sandbox import PATH_KEY_TAG, ModalInputs, ModalSandboxProvider
from bb_environments.providers.planning import read_base_head
from tests.fakes.fake_modal import VALID_TOKEN, FakeModalCloud, local_filesystems
from tests.support.git_daemon import push, served_origin

MEMBER_KEY = "pool-0a1b2c3d4e5f-1"
THREAD_KEY = "t-pooled-1"
SETUP = 'echo "$PWD" >> "$(dirname "$PWD")/setups"\necho "made at $(git rev-parse HEAD)" > made.txt\n'


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", VALID_TOKEN[0])
    monkeypatch.setenv("MODAL_TOKEN_SECRET", VALID_TOKEN[1])
    for name in ("BB_MODAL_IDLE_PAUSE_MINUTES", "BB_MODAL_DOCKERFILE", "BB_MODAL_APP_NAME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cloud(tmp_path: Path) -> FakeModalCloud:
    return FakeModalCloud(exec_handler=local_filesystems(tmp_path / "sandboxes"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def provider(cloud: FakeModalCloud, clock: Clock) -> ModalSandboxProvider:
    return ModalSandboxProvider(sdk=cloud.module, poll_interval_s=0, origin_heads=OriginHeads(clock=clock))


@pytest.fixture
def project(git_repo: Path, git: Callable[..., str], tmp_path: Path) -> Iterator[Path]:
    (git_repo / ".bb-env-setup.sh").write_text(SETUP)
    git(git_repo, "add", ".bb-env-setup.sh")
    git(git_repo, "commit", "--quiet", "-m", "setup")
    served = tmp_path / "served"
    served.mkdir()
    with served_origin(git_repo, served):
        yield git_repo


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "providers" / "modal-sandbox"


def context(project: Path, data_dir: Path, inputs: ModalInputs | None = None) -> ProjectContext:
    return ProjectContext("local", str(project), inputs or ModalInputs(), str(data_dir))


def prepared_member(provider: ModalSandboxProvider, project: Path, data_dir: Path) -> Created:
    """A member as the pool prepares one: its inputs from `member_inputs`, created under its own key."""
    inputs = provider.member_inputs(context(project, data_dir), MEMBER_KEY)
    created = provider.create(
        CreateContext(
            "local", str(project), inputs, str(data_dir), thread_id=MEMBER_KEY.rsplit("-", 1)[0], path_key=MEMBER_KEY
        )
    )
    assert isinstance(created, Created), created
    return created


def bind_context(project: Path, data_dir: Path, member: Created, resource: dict[str, Any] | None = None) -> BindContext:
    return BindContext(
        "local",
        str(project),
        ModalInputs(),
        str(data_dir),
        path=member.path,
        resource=member.resource if resource is None else resource,
        path_key=THREAD_KEY,
    )


def files_of(tmp_path: Path, sandbox_id: str, project: Path) -> Path:
    """The clone in the sandbox's files (see fake_modal.local_filesystems)."""
    return tmp_path / "sandboxes" / sandbox_id / "workspace" / project.name


def git_out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def script_hash(project: Path) -> str | None:
    """How a pool identifies the setup script at the checkout's head (as git-worktree's does)."""
    return setup_hash_at(str(project), git_out(project, "rev-parse", "HEAD"))


def test_modal_sandbox_pools() -> None:
    provider = ModalSandboxProvider()
    assert provider.policy.pool and can_pool(provider)


def test_a_member_prepared_ahead_is_bound_by_tagging_its_sandbox_with_what_its_setup_made(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path, tmp_path: Path
) -> None:
    member = prepared_member(provider, project, data_dir)
    assert member.resource is not None
    sandbox = cloud.sandboxes[member.resource["sandboxId"]]
    assert sandbox.tags == {PATH_KEY_TAG: MEMBER_KEY}
    clone = files_of(tmp_path, sandbox.id, project)
    assert (clone / "made.txt").read_text().strip() == f"made at {git_out(project, 'rev-parse', 'HEAD')}"
    execs_before_binding = len(cloud.execs)

    resource = provider.bind(bind_context(project, data_dir, member))

    assert sandbox.tags == {PATH_KEY_TAG: MEMBER_KEY, BOUND_TAG: THREAD_KEY}
    assert resource == {**member.resource, "boundTo": THREAD_KEY}
    # On the branch a thread's own create leaves the clone on (the origin's default), with what
    # the member's setup made, which ran once: nothing ran in the sandbox to bind it.
    assert git_out(clone, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert (clone / "made.txt").is_file()
    assert (clone.parent / "setups").read_text().splitlines() == [str(clone)]
    assert len(cloud.execs) == execs_before_binding
    # Found by the thread's tag, and still by the member's key (which its removal uses).
    listed = cloud.module.Sandbox.list(tags={BOUND_TAG: THREAD_KEY}, client=cloud.module.Client(VALID_TOKEN))
    assert [found.object_id for found in listed] == [sandbox.id]


def test_a_bind_asked_again_after_a_crash_finds_it_done_and_changes_nothing(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    member = prepared_member(provider, project, data_dir)
    first = provider.bind(bind_context(project, data_dir, member))
    tagged = list(cloud.tag_calls)

    # The core never recorded the first answer: it asks again with the member's resource.
    again = provider.bind(bind_context(project, data_dir, member))

    assert again == first
    assert cloud.tag_calls == tagged and len(tagged) == 1


def test_a_member_bound_to_another_thread_or_whose_sandbox_stopped_is_refused_unchanged(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    member = prepared_member(provider, project, data_dir)
    assert member.resource is not None
    sandbox = cloud.sandboxes[member.resource["sandboxId"]]
    sandbox.tags[BOUND_TAG] = "t-other-1"
    with pytest.raises(BindFailed, match="bound to t-other-1 already"):
        provider.bind(bind_context(project, data_dir, member))

    del sandbox.tags[BOUND_TAG]
    sandbox.running = False  # its lifetime ended while it waited
    with pytest.raises(BindFailed, match="has stopped"):
        provider.bind(bind_context(project, data_dir, member))
    assert sandbox.tags == {PATH_KEY_TAG: MEMBER_KEY} and cloud.tag_calls == []

    gone = {**member.resource, "sandboxId": "sb-nowhere"}
    with pytest.raises(BindFailed, match="no longer exists"):
        provider.bind(bind_context(project, data_dir, member, gone))


def test_a_member_paused_while_it_waited_is_resumed_for_its_thread_with_the_threads_tag_and_no_setup(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    member = prepared_member(provider, project, data_dir)
    assert member.resource is not None
    paused = provider.pause(member.resource)
    execs = len(cloud.execs)

    bound = provider.bind(bind_context(project, data_dir, member, paused))
    assert bound is not None and cloud.tag_calls == []
    resumed = provider.resume(bound)

    assert cloud.sandboxes[resumed["sandboxId"]].tags == {PATH_KEY_TAG: MEMBER_KEY, BOUND_TAG: THREAD_KEY}
    assert len(cloud.execs) == execs


def test_base_head_reads_the_origins_head_and_sees_a_new_one_once_the_last_read_is_old_without_changing_the_checkout(
    provider: ModalSandboxProvider, project: Path, data_dir: Path, git: Callable[..., str], clock: Clock
) -> None:
    head = provider.base_head(context(project, data_dir))
    assert (head.base_commit, head.setup_hash) == (git_out(project, "rev-parse", "HEAD"), script_hash(project))
    assert head.setup_hash is not None

    (project / ".bb-env-setup.sh").write_text(SETUP + "echo second > second.txt\n")
    git(project, "commit", "--quiet", "-am", "a new setup")
    clock.now += ORIGIN_HEAD_FRESH_S
    assert provider.base_head(context(project, data_dir)) == head  # committed, not pushed: not the origin's

    push(project)
    refs = git_out(project, "for-each-ref")
    clock.now += ORIGIN_HEAD_FRESH_S - 0.1
    assert provider.base_head(context(project, data_dir)) == head  # the origin is asked once per freshness
    clock.now += 0.1
    moved = provider.base_head(context(project, data_dir))
    assert (moved.base_commit, moved.setup_hash) == (git_out(project, "rev-parse", "HEAD"), script_hash(project))
    assert moved.setup_hash != head.setup_hash
    assert git_out(project, "for-each-ref") == refs


def test_a_head_the_checkout_does_not_hold_yet_is_unknown_until_fetched(
    provider: ModalSandboxProvider, project: Path, data_dir: Path, git: Callable[..., str], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    git(tmp_path, "clone", "--quiet", git_out(project, "remote", "get-url", "origin"), str(elsewhere))
    git(elsewhere, "commit", "--quiet", "--allow-empty", "-m", "pushed from another clone")
    git(elsewhere, "push", "--quiet", "origin", "main")

    with pytest.raises(BaseUnknown, match="is not in .* yet.*git fetch"):
        provider.base_head(context(project, data_dir))

    git(project, "fetch", "--quiet", "origin")
    assert provider.base_head(context(project, data_dir)).base_commit == git_out(elsewhere, "rev-parse", "HEAD")


def test_an_origin_out_of_reach_binds_no_member_to_a_thread_and_prepares_none(
    provider: ModalSandboxProvider, project: Path, data_dir: Path, git: Callable[..., str]
) -> None:
    git(project, "remote", "set-url", "origin", "git://127.0.0.1:9/nowhere.git")
    ctx = context(project, data_dir)
    with pytest.raises(BaseUnknown, match="could not read the head of the origin remote"):
        provider.base_head(ctx)
    assert read_base_head(provider, ctx, member=False) is None
    with pytest.raises(PlanRefused, match="cannot prepare a member now"):
        read_base_head(provider, ctx, member=True)


def test_member_inputs_are_the_requests_own_and_bad_ones_are_refused(
    provider: ModalSandboxProvider, project: Path, data_dir: Path
) -> None:
    asked = ModalInputs(cpu=4.0, memory_mib=8192, timeout_hours=12)
    assert provider.member_inputs(context(project, data_dir, asked), MEMBER_KEY) == asked
    with pytest.raises(InvalidInputs, match="cpu: must be between 0.25 and 16"):
        provider.member_inputs(context(project, data_dir, ModalInputs(cpu=64)), MEMBER_KEY)


def test_a_resume_that_finds_the_members_sandbox_still_running_tags_it_for_its_thread(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    member = prepared_member(provider, project, data_dir)
    assert member.resource is not None
    paused = provider.pause(member.resource)
    left_running = cloud.sandboxes[member.resource["sandboxId"]]
    left_running.running = True  # a pause cut off before it terminated the sandbox

    bound = provider.bind(bind_context(project, data_dir, member, paused))
    assert bound is not None
    resumed = provider.resume(bound)

    assert resumed["sandboxId"] == left_running.id and len(cloud.running()) == 1
    assert left_running.tags == {PATH_KEY_TAG: MEMBER_KEY, BOUND_TAG: THREAD_KEY}
