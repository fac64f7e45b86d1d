"""The modal-sandbox provider against a fake placed at the modal SDK boundary (tests/fakes/fake_modal.py)."""

from __future__ import annotations

import inspect
import json
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import modal
import modal.container_process
import modal.exception
import modal.experimental
import modal.io_streams
import pytest
from click.testing import CliRunner

from bb_environments.entrypoints.cli import machine_group, modal_group
from bb_environments.entrypoints.config import Settings
from bb_environments.providers.contract import (
    READY,
    CreateContext,
    Created,
    CreateFailed,
    EnvironmentProvider,
    InvalidInputs,
    Previous,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveFailed,
)
from bb_environments.providers.modal_machine import MACHINE_TAG, ModalMachines
from bb_environments.providers.modal_sandbox import (
    PATH_KEY_TAG,
    ModalInputs,
    ModalSandboxProvider,
    project_origin,
    sandbox_path,
    tag_value,
)
from bb_environments.providers.modal_scripts import CLONE_SCRIPT, SETUP_SCRIPT
from bb_environments.providers.modal_sdk import ModalOperationFailed
from bb_environments.providers.modal_settings import (
    NO_CREDENTIALS,
    SHIPPED_DOCKERFILE,
    DockerfileError,
    SettingsError,
    load_settings,
    provider_data_dir,
    validate_dockerfile,
)
from tests.fakes.fake_modal import VALID_TOKEN, ExecCall, ExecResult, FakeModalCloud

ORIGIN = "https://github.com/example/project.git"
PATH_KEY = "t-thread-1"


class RecordingReporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, text: str) -> None:
        self.lines.append(text)

    def log(self, text: str) -> None:
        self.lines.append(text)


class Crash(BaseException):
    """The service dying mid-call: nothing in the provider may catch it."""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "MODAL_TOKEN_ID",
        "MODAL_TOKEN_SECRET",
        "BB_MODAL_IDLE_PAUSE_MINUTES",
        "BB_MODAL_DOCKERFILE",
        "BB_MODAL_APP_NAME",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", VALID_TOKEN[0])
    monkeypatch.setenv("MODAL_TOKEN_SECRET", VALID_TOKEN[1])


@pytest.fixture
def cloud() -> FakeModalCloud:
    return FakeModalCloud()


@pytest.fixture
def provider(cloud: FakeModalCloud) -> ModalSandboxProvider:
    return ModalSandboxProvider(sdk=cloud.module, poll_interval_s=0)


@pytest.fixture
def machines(cloud: FakeModalCloud) -> ModalMachines:
    return ModalMachines(sdk=cloud.module)


@pytest.fixture
def project(git_repo: Path, git: Callable[..., str]) -> Path:
    git(git_repo, "remote", "add", "origin", ORIGIN)
    return git_repo


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "providers" / "modal-sandbox"


def create_context(project: Path, data_dir: Path, **overrides: Any) -> CreateContext:
    values: dict[str, Any] = dict(
        host_id="local",
        project_path=str(project),
        inputs=ModalInputs(),
        data_dir=str(data_dir),
        thread_id="t-thread",
        path_key=PATH_KEY,
        report=RecordingReporter(),
    )
    return CreateContext(**(values | overrides))


def remove_context(data_dir: Path, resource: dict[str, Any] | None, **overrides: Any) -> RemoveContext:
    values: dict[str, Any] = dict(
        host_id="local",
        data_dir=str(data_dir),
        project_path=None,
        inputs=ModalInputs(),
        path=None,
        path_key=PATH_KEY,
        attempt=1,
        resource=resource,
    )
    return RemoveContext(**(values | overrides))


def created(result: Any) -> Created:
    assert isinstance(result, Created), result
    return result


def scripts_run(cloud: FakeModalCloud) -> list[str]:
    """Which of our scripts ran, in order ("clone"/"setup")."""
    names = {CLONE_SCRIPT: "clone", SETUP_SCRIPT: "setup"}
    return [names[call.args[2]] for call in cloud.execs]


# -- the fake matches the installed modal ----------------------------------------------------------

FAKE = FakeModalCloud().module
FAKED_CALLABLES = [
    (FAKE.Client.from_credentials, modal.Client.from_credentials),
    (FAKE.Client.hello, modal.Client.hello),
    (FAKE.Client.close, modal.Client.close),
    (FAKE.App.lookup, modal.App.lookup),
    (FAKE.Image.from_name, modal.Image.from_name),
    (FAKE.Image.from_dockerfile, modal.Image.from_dockerfile),
    (FAKE.Image.from_id, modal.Image.from_id),
    (FAKE.Image.build, modal.Image.build),
    (FAKE.Image.publish, modal.Image.publish),
    (FAKE.Sandbox.create, modal.Sandbox.create),
    (FAKE.Sandbox.from_id, modal.Sandbox.from_id),
    (FAKE.Sandbox.list, modal.Sandbox.list),
    (FAKE.Sandbox.get_tags, modal.Sandbox.get_tags),
    (FAKE.Sandbox.set_tags, modal.Sandbox.set_tags),
    (FAKE.Sandbox.poll, modal.Sandbox.poll),
    (FAKE.Sandbox.exec, modal.Sandbox.exec),
    (FAKE.Sandbox.snapshot_filesystem, modal.Sandbox.snapshot_filesystem),
    (FAKE.Sandbox.terminate, modal.Sandbox.terminate),
    (FAKE.experimental.image_delete, modal.experimental.image_delete),
    (FAKE.container_process.ContainerProcess.poll, modal.container_process.ContainerProcess.poll),
    (FAKE.io_streams.StreamWriter.write, modal.io_streams.StreamWriter.write),
    (FAKE.io_streams.StreamWriter.write_eof, modal.io_streams.StreamWriter.write_eof),
    (FAKE.io_streams.StreamWriter.drain, modal.io_streams.StreamWriter.drain),
    (FAKE.io_streams.StreamReader.read, modal.io_streams.StreamReader.read),
]


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    return parameters


@pytest.mark.parametrize(("fake", "real"), FAKED_CALLABLES, ids=lambda f: getattr(f, "__qualname__", repr(f)))
def test_fake_signature_is_a_compatible_subset_of_modal(fake: Callable[..., Any], real: Callable[..., Any]) -> None:
    """Every fake parameter exists in modal with the same kind and default, and nothing modal requires is missing:
    a call the fake accepts is a call modal accepts."""
    real_parameters = {p.name: p for p in _parameters(real)}
    for parameter in _parameters(fake):
        assert parameter.name in real_parameters, f"modal has no parameter {parameter.name!r}"
        twin = real_parameters[parameter.name]
        assert parameter.kind == twin.kind, parameter.name
        assert parameter.default == twin.default, parameter.name
    fake_names = {p.name for p in _parameters(fake)}
    required = [
        p.name
        for p in real_parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert set(required) <= fake_names


def test_fake_attributes_and_exceptions_exist_in_modal() -> None:
    assert isinstance(modal.Sandbox.object_id, property) and isinstance(modal.Image.object_id, property)
    assert isinstance(modal.App.app_id, property)
    assert isinstance(modal.container_process.ContainerProcess.returncode, property)
    assert {"stdin", "stdout"} <= set(dir(modal.container_process.ContainerProcess))
    assert modal.Error is modal.exception.Error
    for name in vars(FAKE.exception):
        assert issubclass(getattr(modal.exception, name), modal.exception.Error), name


# -- declaration, availability, validation ---------------------------------------------------------


def test_satisfies_the_provider_protocol() -> None:
    provider = ModalSandboxProvider()
    assert isinstance(provider, EnvironmentProvider)
    assert (provider.id, provider.display_name) == ("modal-sandbox", "Modal sandbox")
    assert provider.policy.path_keys == "per-attempt" and provider.policy.retire_grace_ms == 300_000
    assert provider.requires.git_checkout


def test_blocked_without_credentials(provider: ModalSandboxProvider, data_dir: Path) -> None:
    availability = provider.availability(ProjectContext("local", None, ModalInputs(), str(data_dir)))
    assert (availability.status, availability.reason) == ("blocked", NO_CREDENTIALS)


@pytest.mark.usefixtures("credentials")
def test_ready_with_credentials(provider: ModalSandboxProvider, data_dir: Path) -> None:
    assert provider.availability(ProjectContext("local", None, ModalInputs(), str(data_dir))) == READY


@pytest.mark.usefixtures("credentials")
def test_blocked_by_a_malformed_dockerfile_setting_naming_the_line(
    provider: ModalSandboxProvider, tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian\nRUN echo hi\nFORM oops\n")
    monkeypatch.setenv("BB_MODAL_DOCKERFILE", str(dockerfile))
    availability = provider.availability(ProjectContext("local", None, ModalInputs(), str(data_dir)))
    assert availability.status == "blocked"
    assert "line 3: 'FORM oops' does not start with a known instruction" in availability.reason


def test_validate_accepts_a_project_with_an_origin(
    provider: ModalSandboxProvider, project: Path, data_dir: Path
) -> None:
    provider.validate(ProjectContext("local", str(project), ModalInputs(), str(data_dir)))


def test_validate_refuses_a_checkout_without_origin(
    provider: ModalSandboxProvider, git_repo: Path, data_dir: Path
) -> None:
    with pytest.raises(InvalidInputs, match="has no origin remote"):
        provider.validate(ProjectContext("local", str(git_repo), ModalInputs(), str(data_dir)))


@pytest.mark.parametrize("url", ["/srv/git/project.git", "../project", "file:///srv/project.git"])
def test_validate_refuses_a_local_origin(
    provider: ModalSandboxProvider, git_repo: Path, git: Callable[..., str], data_dir: Path, url: str
) -> None:
    git(git_repo, "remote", "add", "origin", url)
    with pytest.raises(InvalidInputs, match="local path"):
        provider.validate(ProjectContext("local", str(git_repo), ModalInputs(), str(data_dir)))


def test_scp_style_origin_is_remote(git_repo: Path, git: Callable[..., str]) -> None:
    git(git_repo, "remote", "add", "origin", "git@github.com:example/project.git")
    assert project_origin(str(git_repo)) == "git@github.com:example/project.git"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (ModalInputs(cpu=100), "cpu: must be between 0.25 and 16"),
        (ModalInputs(memory_mib=10), "memoryMib: must be between 512 and 65536"),
        (ModalInputs(timeout_hours=48), "timeoutHours: must be between 1 and 24"),
    ],
)
def test_validate_checks_input_bounds(
    provider: ModalSandboxProvider, project: Path, data_dir: Path, inputs: ModalInputs, message: str
) -> None:
    with pytest.raises(InvalidInputs, match=message):
        provider.validate(ProjectContext("local", str(project), inputs, str(data_dir)))


def test_tag_values_fit_modal_rules() -> None:
    assert tag_value("t-abc_1") == "t-abc_1"
    long_key = "t" * 120 + "-1"
    assert len(tag_value(long_key)) <= 63 and tag_value(long_key) == tag_value(long_key)


# -- create ----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("credentials")
def test_create_builds_the_image_once_starts_a_tagged_sandbox_clones_and_sets_up(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    context = create_context(project, data_dir)
    result = created(provider.create(context))

    shipped = SHIPPED_DOCKERFILE.read_text()
    assert cloud.builds == [shipped]
    image_name = next(iter(cloud.published))
    assert image_name.startswith("bb-standard:") and len(image_name.split(":")[1]) == 64
    [sandbox] = cloud.sandboxes.values()
    assert sandbox.tags == {PATH_KEY_TAG: PATH_KEY}
    assert (sandbox.timeout, sandbox.cpu, sandbox.memory) == (24 * 3600, 2.0, 4096)
    assert sandbox.image_id == cloud.published[image_name]
    assert scripts_run(cloud) == ["clone", "setup"]
    workdir = f"/workspace/{project.name}"
    assert result.path == sandbox_path(PATH_KEY, workdir) == f"modal://{PATH_KEY}{workdir}"
    assert result.owns_path is False
    assert result.resource == {
        "sandboxId": sandbox.id,
        "imageId": sandbox.image_id,
        "snapshotId": None,
        "supersededSnapshotIds": [],
        "appName": "bb-environments",
        "pathKey": PATH_KEY,
        "workdir": workdir,
        "cpu": 2.0,
        "memoryMib": 4096,
        "timeoutHours": 24,
    }
    assert cloud.closed_clients == 1


@pytest.mark.usefixtures("credentials")
def test_a_second_environment_reuses_the_published_image(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    created(provider.create(create_context(project, data_dir)))
    context = create_context(project, data_dir, path_key="t-other-1")
    created(provider.create(context))
    assert len(cloud.builds) == 1 and len(cloud.running()) == 2
    assert any(line.startswith("Reusing the bb-standard:") for line in context.report.lines)


@pytest.mark.usefixtures("credentials")
def test_the_clone_url_and_its_token_travel_on_stdin_only(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, git_repo: Path, git: Callable[..., str], data_dir: Path
) -> None:
    url = "https://bot:ghp_secret123@github.com/example/private.git"
    git(git_repo, "remote", "add", "origin", url)
    cloud.exec_handler = lambda call: (
        ExecResult(0, f"Cloning from {url}") if call.args[2] == CLONE_SCRIPT else ExecResult()
    )
    context = create_context(git_repo, data_dir)
    result = created(provider.create(context))

    clone = cloud.execs[0]
    assert clone.stdin == url + "\n"
    assert all("ghp_secret123" not in argument for call in cloud.execs for argument in call.args)
    transcript = "\n".join(context.report.lines)
    assert "ghp_secret123" not in transcript and "https://***@github.com/example/private.git" in transcript
    assert "ghp_secret123" not in json.dumps(result.resource)


@pytest.mark.usefixtures("credentials")
def test_no_modal_credential_reaches_the_sandbox_the_resource_or_the_transcript(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    context = create_context(project, data_dir)
    result = created(provider.create(context))
    visible = json.dumps(result.resource) + "\n".join(context.report.lines)
    visible += "".join(call.stdin + " ".join(call.args) for call in cloud.execs)
    for secret in VALID_TOKEN:
        assert secret not in visible


@pytest.mark.usefixtures("credentials")
def test_cancel_while_create_is_in_flight_terminates_the_sandbox(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    cancelled = threading.Event()
    cloud.on_sandbox_created = lambda record: cancelled.set()
    result = provider.create(create_context(project, data_dir, cancelled=cancelled))
    assert result == CreateFailed("terminal", "cancelled")
    assert len(cloud.sandboxes) == 1 and cloud.running() == []
    assert cloud.execs == []


@pytest.mark.usefixtures("credentials")
def test_a_create_rerun_after_a_crash_reuses_the_sandbox_and_never_starts_a_second(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    def crash(record: Any) -> None:
        cloud.on_sandbox_created = lambda record: None
        raise Crash()

    cloud.on_sandbox_created = crash
    with pytest.raises(Crash):
        provider.create(create_context(project, data_dir))
    [orphan] = cloud.running()

    context = create_context(project, data_dir, attempt=2, previous=Previous(1, None, None))
    result = created(provider.create(context))
    assert len(cloud.sandboxes) == 1
    assert result.resource["sandboxId"] == orphan.id
    assert scripts_run(cloud) == ["clone", "setup"]
    assert f"Reusing sandbox {orphan.id}, left by an earlier attempt" in context.report.lines


@pytest.mark.usefixtures("credentials")
def test_a_create_rerun_after_setup_reuses_the_sandbox_and_relies_on_the_in_sandbox_markers(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    first = created(provider.create(create_context(project, data_dir)))
    second = created(provider.create(create_context(project, data_dir, attempt=2)))
    assert second.resource["sandboxId"] == first.resource["sandboxId"] and len(cloud.sandboxes) == 1
    # Both runs issue the idempotent scripts; the scripts themselves skip finished work
    # (test_clone_and_setup_scripts_are_idempotent runs them for real).
    assert scripts_run(cloud) == ["clone", "setup", "clone", "setup"]


@pytest.mark.usefixtures("credentials")
def test_duplicate_sandboxes_under_one_key_are_reduced_to_one(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    created(provider.create(create_context(project, data_dir)))
    app = cloud.module.App.lookup("bb-environments", client=cloud.module.Client.from_credentials(*VALID_TOKEN))
    image = cloud.module.Image.from_id(next(iter(cloud.published.values())))
    client = cloud.module.Client.from_credentials(*VALID_TOKEN)
    cloud.module.Sandbox.create(app=app, image=image, tags={PATH_KEY_TAG: PATH_KEY}, client=client)
    result = created(provider.create(create_context(project, data_dir, attempt=2)))
    assert [record.id for record in cloud.running()] == [result.resource["sandboxId"]]


@pytest.mark.usefixtures("credentials")
def test_a_failing_setup_fails_terminally_and_terminates_the_sandbox(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    def handler(call: ExecCall) -> ExecResult:
        return ExecResult(3, "installing\nnpm ERR! missing script\n") if call.args[2] == SETUP_SCRIPT else ExecResult()

    cloud.exec_handler = handler
    context = create_context(project, data_dir)
    result = provider.create(context)
    assert result == CreateFailed(
        "terminal", ".bb-env-setup.sh failed in the sandbox (exit 3): npm ERR! missing script"
    )
    assert cloud.running() == []
    assert "npm ERR! missing script" in context.report.lines


def test_create_without_credentials_fails_clearly(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    assert provider.create(create_context(project, data_dir)) == CreateFailed("terminal", NO_CREDENTIALS)
    assert cloud.sandboxes == {}


def test_create_with_a_wrong_credential_fails_clearly(
    provider: ModalSandboxProvider,
    cloud: FakeModalCloud,
    project: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-wrong-id")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-wrong-secret")
    result = provider.create(create_context(project, data_dir))
    assert isinstance(result, CreateFailed) and result.failure == "terminal"
    assert result.message.startswith("Modal refused the credentials (token ak-w…)")
    assert "as-wrong-secret" not in result.message and "ak-wrong-id" not in result.message


# -- pause and resume ------------------------------------------------------------------------------


@pytest.fixture
def environment(provider: ModalSandboxProvider, project: Path, data_dir: Path, credentials: None) -> dict[str, Any]:
    resource = created(provider.create(create_context(project, data_dir))).resource
    assert resource is not None
    return resource


def test_pause_snapshots_checkpoints_then_terminates(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    checkpoints: list[tuple[dict[str, Any], bool]] = []
    sandbox = cloud.sandboxes[environment["sandboxId"]]
    paused = provider.pause(environment, checkpoint=lambda r: checkpoints.append((r, sandbox.running)))

    [snapshot] = cloud.snapshots
    [(checkpointed, running_at_checkpoint)] = checkpoints
    assert checkpointed["snapshotId"] == snapshot and running_at_checkpoint
    assert paused == {**environment, "snapshotId": snapshot, "sandboxId": None}
    assert not sandbox.running


def test_a_failed_snapshot_leaves_the_sandbox_running(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    cloud.snapshot_error = cloud.module.exception.SnapshotCreationError("container not ready")
    with pytest.raises(
        ModalOperationFailed, match="could not snapshot the sandbox \\(it keeps running\\): container not ready"
    ) as failed:
        provider.pause(environment)
    assert failed.value.transient
    assert cloud.sandboxes[environment["sandboxId"]].running


def test_resume_starts_from_the_snapshot_with_the_same_tags_and_skips_setup(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    paused = provider.pause(environment)
    execs_before = len(cloud.execs)
    resumed = provider.resume(paused)

    [sandbox] = cloud.running()
    assert resumed == {**paused, "sandboxId": sandbox.id}
    assert sandbox.image_id == paused["snapshotId"]
    assert sandbox.tags == {PATH_KEY_TAG: PATH_KEY}
    assert (sandbox.timeout, sandbox.cpu, sandbox.memory) == (24 * 3600, 2.0, 4096)
    assert len(cloud.execs) == execs_before


def test_superseded_snapshots_are_deleted_only_after_their_successor_is_recorded(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    first = provider.pause(environment)
    second = provider.pause(provider.resume(first))
    assert second["supersededSnapshotIds"] == [first["snapshotId"]] and cloud.deleted_images == []
    resumed = provider.resume(second)
    assert cloud.deleted_images == [first["snapshotId"]]
    assert resumed["supersededSnapshotIds"] == [] and resumed["snapshotId"] == second["snapshotId"]


def test_resume_reuses_a_sandbox_a_crashed_pause_left_running(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    def crash(resource: dict[str, Any]) -> None:
        raise Crash()

    with pytest.raises(Crash):
        provider.pause(environment, checkpoint=crash)
    snapshotted = {**environment, "snapshotId": cloud.snapshots[0]}
    resumed = provider.resume(snapshotted)
    assert resumed["sandboxId"] == environment["sandboxId"] and len(cloud.sandboxes) == 1


def test_a_pause_killed_after_terminating_before_paused_was_recorded_is_finished_by_the_next_pause(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    checkpoints: list[dict[str, Any]] = []
    provider.pause(environment, checkpoint=checkpoints.append)  # killed here: Paused never recorded
    [in_the_log] = checkpoints
    assert in_the_log["sandboxId"] == environment["sandboxId"] and cloud.running() == []

    paused = provider.pause(in_the_log, checkpoint=checkpoints.append)

    [snapshot] = cloud.snapshots
    assert paused == {**environment, "snapshotId": snapshot, "sandboxId": None}
    assert len(checkpoints) == 1
    resumed = provider.resume(paused)
    [sandbox] = cloud.running()
    assert resumed["sandboxId"] == sandbox.id and sandbox.image_id == snapshot


def test_a_pause_of_a_sandbox_that_stopped_without_being_snapshotted_still_fails(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any]
) -> None:
    paused = provider.pause(environment)
    resumed = provider.resume(paused)
    cloud.sandboxes[resumed["sandboxId"]].running = False  # its lifetime ran out, say
    with pytest.raises(ModalOperationFailed, match="has already stopped, so there is nothing to snapshot"):
        provider.pause(resumed)
    assert cloud.snapshots == [paused["snapshotId"]]


def test_idle_pause_is_due_after_the_configured_minutes(provider: ModalSandboxProvider, data_dir: Path) -> None:
    now = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    assert provider.idle_pause_due(now - timedelta(minutes=15), now, str(data_dir))
    assert not provider.idle_pause_due(now - timedelta(minutes=14), now, str(data_dir))
    data_dir.mkdir(parents=True)
    (data_dir / "settings.json").write_text('{"idlePauseMinutes": 0}')
    assert not provider.idle_pause_due(now - timedelta(days=1), now, str(data_dir))


# -- remove ----------------------------------------------------------------------------------------


def test_remove_terminates_and_deletes_snapshots_but_keeps_the_shared_image(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any], data_dir: Path
) -> None:
    paused_twice = provider.pause(provider.resume(provider.pause(environment)))
    resumed = provider.resume(paused_twice)
    assert provider.remove(remove_context(data_dir, resumed)) == Removed()
    assert cloud.running() == []
    assert set(cloud.deleted_images) == set(cloud.snapshots)
    assert environment["imageId"] not in cloud.deleted_images


@pytest.mark.usefixtures("credentials")
def test_remove_without_a_resource_finds_the_sandbox_by_its_tag(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, project: Path, data_dir: Path
) -> None:
    cloud.on_sandbox_created = lambda record: (_ for _ in ()).throw(Crash())
    with pytest.raises(Crash):
        provider.create(create_context(project, data_dir))
    assert provider.remove(remove_context(data_dir, None)) == Removed()
    assert cloud.running() == []


@pytest.mark.usefixtures("credentials")
def test_remove_when_nothing_was_ever_created(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, data_dir: Path
) -> None:
    assert provider.remove(remove_context(data_dir, None)) == Removed()
    assert cloud.apps == {}


def test_remove_without_credentials_fails_for_a_later_retry(provider: ModalSandboxProvider, data_dir: Path) -> None:
    assert provider.remove(remove_context(data_dir, None)) == RemoveFailed(NO_CREDENTIALS)


def test_remove_is_idempotent(
    provider: ModalSandboxProvider, cloud: FakeModalCloud, environment: dict[str, Any], data_dir: Path
) -> None:
    paused = provider.pause(environment)
    assert provider.remove(remove_context(data_dir, paused)) == Removed()
    assert provider.remove(remove_context(data_dir, paused)) == Removed()


# -- machines and account --------------------------------------------------------------------------


@pytest.mark.usefixtures("credentials")
def test_machines_are_created_listed_and_removed(
    machines: ModalMachines, cloud: FakeModalCloud, data_dir: Path
) -> None:
    machine_info = machines.create_machine(str(data_dir), ModalInputs(), RecordingReporter())
    assert machine_info["tags"][MACHINE_TAG] == "1"
    assert [m["id"] for m in machines.list_machines(str(data_dir))] == [machine_info["id"]]
    assert machines.remove_machine(machine_info["id"])
    assert machines.list_machines(str(data_dir)) == []
    assert not machines.remove_machine("sb-missing")


def test_remove_machine_leaves_environment_sandboxes_alone(
    machines: ModalMachines, environment: dict[str, Any]
) -> None:
    with pytest.raises(ModalOperationFailed, match="is not a bb machine"):
        machines.remove_machine(environment["sandboxId"])


@pytest.mark.usefixtures("credentials")
def test_inspect_account_checks_credentials_without_allocating(
    machines: ModalMachines, cloud: FakeModalCloud, data_dir: Path
) -> None:
    status = machines.inspect_account(str(data_dir))
    assert (status.status, status.token_id, status.app_exists) == ("ok", "ak-f…", False)
    assert cloud.apps == {} and cloud.sandboxes == {}


def test_inspect_account_blocked_by_a_wrong_token(
    machines: ModalMachines, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-wrong")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-wrong")
    status = machines.inspect_account(str(data_dir))
    assert status.status == "blocked" and status.reason.startswith("Modal refused the credentials")


# -- settings and Dockerfiles ----------------------------------------------------------------------


def test_the_shipped_dockerfile_is_valid() -> None:
    validate_dockerfile(SHIPPED_DOCKERFILE.read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM debian\nRUN apt-get update \\\n  && apt-get install -y git\nCOPPY . /x\n", "line 4: 'COPPY . /x'"),
        ("# comment\nRUN echo first\nFROM debian\n", "line 2: 'RUN echo first' comes before FROM"),
        ("FROM\n", "line 1: 'FROM' names no image"),
        ("FROM debian\nRUN echo \\\n", "line 2: 'RUN echo' ends with a line continuation"),
    ],
)
def test_malformed_dockerfiles_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=message):
        validate_dockerfile(text)


def test_dockerfile_grammar_accepts_args_comments_and_continuations() -> None:
    validate_dockerfile('# syntax=docker/dockerfile:1\nARG BASE=debian\nfrom ${BASE}\nRUN a \\\n\n  b\nCMD ["sh"]\n')
    with pytest.raises(SettingsError, match="has no FROM"):
        validate_dockerfile("ARG X=1\n")


def test_settings_refuse_a_token_in_the_file(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "settings.json").write_text('{"tokenSecret": "as-123"}')
    with pytest.raises(SettingsError, match="tokenSecret"):
        load_settings(data_dir)


# -- the in-sandbox scripts, run for real with bash ------------------------------------------------


def test_clone_and_setup_scripts_are_idempotent(git_repo: Path, git: Callable[..., str], tmp_path: Path) -> None:
    (git_repo / ".bb-env-setup.sh").write_text('echo ran >> "$HOME_COUNTER"\n')
    git(git_repo, "add", ".bb-env-setup.sh")
    git(git_repo, "commit", "--quiet", "-m", "setup")
    target = tmp_path / "workspace" / "project"
    counter = tmp_path / "counter"

    def run(script: str, stdin: str = "") -> str:
        completed = subprocess.run(
            ["bash", "-c", script, "bb", str(target)],
            input=stdin,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HOME_COUNTER": str(counter)},
        )
        assert completed.returncode == 0, completed.stdout + completed.stderr
        return completed.stdout

    run(CLONE_SCRIPT, f"{git_repo}\n")
    assert (target / "README.md").is_file() and not (target.parent / "project.partial").exists()
    assert "already cloned" in run(CLONE_SCRIPT, f"{git_repo}\n")
    run(SETUP_SCRIPT)
    assert "already ran" in run(SETUP_SCRIPT)
    assert counter.read_text() == "ran\n"


# -- the CLI ---------------------------------------------------------------------------------------


def invoke(group: Any, tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(group, list(args), obj=Settings.load(str(tmp_path)))


def test_cli_image_set_refuses_a_malformed_dockerfile_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUNN echo\n")
    result = invoke(modal_group, tmp_path, "image", "set", "--file", str(bad), "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "invalid_input" and "line 2: 'RUNN echo'" in error["message"]
    assert not (provider_data_dir(tmp_path) / "Dockerfile").exists()


def test_cli_image_set_show_reset(tmp_path: Path) -> None:
    good = tmp_path / "Dockerfile"
    good.write_text("FROM python:3.12-slim\nRUN pip install uv\n")
    stored = json.loads(invoke(modal_group, tmp_path, "image", "set", "--file", str(good), "--json").stdout)
    assert stored["source"] == "data-dir" and stored["dockerfile"] == good.read_text()
    shown = json.loads(invoke(modal_group, tmp_path, "image", "show", "--json").stdout)
    assert shown["imageName"] == stored["imageName"] == f"bb-standard:{stored['sha256']}"
    reset = json.loads(invoke(modal_group, tmp_path, "image", "reset", "--json").stdout)
    assert reset["source"] == "shipped" and reset["removedStored"] is True


def test_cli_account_inspect_blocked_without_credentials(tmp_path: Path) -> None:
    result = invoke(modal_group, tmp_path, "account", "inspect", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"status": "blocked", "reason": NO_CREDENTIALS}


def test_cli_machine_create_without_credentials_is_one_sentence(tmp_path: Path) -> None:
    result = invoke(machine_group, tmp_path, "create", "--provider", "modal-sandbox", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"error": {"code": "failed", "message": NO_CREDENTIALS}}
    assert "Traceback" not in result.output


def test_cli_machine_remove_needs_yes(tmp_path: Path) -> None:
    result = invoke(machine_group, tmp_path, "remove", "sb-123", "--json")
    assert result.exit_code == 2 and "pass --yes" in json.loads(result.stdout)["error"]["message"]
