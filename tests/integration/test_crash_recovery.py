"""SIGKILL the service at each step, restart it, and check that every environment ends right.

After each restart: the environment reaches its end state, each hook ran exactly once (marker
files), no workspace is left, every path claim is released, and each environment's event
versions are gap-free.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from bb_environments.providers.host.processes import command_lines
from tests.integration.conftest import Service, eventually, service_environment
from tests.support.gated_provider import calls, gate

GATED = "tests.support.gated_provider:GatedProvider"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose hooks append to markers and wait for a gate file when asked to."""
    project = tmp_path / "project"
    project.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    for kind in ("setup", "teardown"):
        (project / f".bb-env-{kind}.sh").write_text(
            f"echo {kind} >> {markers}/{kind}\n"
            f"echo {kind} started\n"
            f"while [ -e {tmp_path}/hold-{kind} ]; do sleep 0.02; done\n"
            f"echo {kind} done\n"
        )
    return project


def ran(tmp_path: Path, kind: str) -> int:
    marker = tmp_path / "markers" / kind
    return len(marker.read_text().split()) if marker.exists() else 0


def provider_dir(service: Service) -> Path:
    return service.data_dir / "providers" / "gated"


async def start(tmp_path: Path, crash_at: str | None = None) -> Service:
    overrides = {"BB_EXTRA_PROVIDERS": GATED}
    if crash_at:
        overrides["BB_CRASH_AT"] = crash_at
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", **overrides))
    await service.start()
    return service


async def restart(service: Service, crash_at: str | None = None) -> Service:
    """Start the service again on the same data dir (and the embedded nats-server it left), with
    the settings it had but its crash point."""
    if service.process is not None and service.process.poll() is None:
        service.kill()
    service.environment = service.environment | {"BB_EXTRA_PROVIDERS": GATED, "BB_CRASH_AT": crash_at or ""}
    await service.start()
    return service


async def died(service: Service, timeout: float = 90) -> None:
    # Generous: on a loaded 2-core machine a spawn's CLI, the service and its nats-server share the cores.
    await eventually(lambda: service.process.poll() is not None, "the service's crash point", timeout)


async def open_gates(service: Service, *names: str) -> None:
    for name in names:
        path = gate(provider_dir(service), name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


async def spawn(service: Service, project: Path, thread_id: str = "t1") -> str:
    return await service.spawn("gated", project=project, thread_id=thread_id)


async def wait_for_call(service: Service, prefix: str, count: int = 1) -> None:
    for _ in range(600):
        if sum(1 for line in calls(provider_dir(service)) if line.startswith(prefix)) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"provider never saw {prefix!r}: {calls(provider_dir(service))}")


async def wait_for_file(path: Path) -> None:
    for _ in range(600):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


async def start_with_setup_held(tmp_path: Path, project: Path) -> tuple[Service, str]:
    """A service whose environment's setup hook has started and is held running."""
    (tmp_path / "hold-setup").touch()
    service = await start(tmp_path)
    try:
        await open_gates(service, "create", "remove")
        environment_id = await spawn(service, project)
        await wait_for_file(tmp_path / "markers" / "setup")
    except BaseException:
        await service.stop()
        raise
    return service, environment_id


async def assert_consistent_log(service: Service, environment_id: str) -> None:
    exported = await service.bb("events", "export")
    events = [json.loads(line) for line in exported.stdout.splitlines()]
    versions = [e["version"] for e in events if e.get("environmentId") == environment_id and "threadIds" in e]
    assert versions == list(range(1, len(versions) + 1))
    holders: dict[str, str | None] = {}
    for event in events:
        if "claimId" in event:
            holders[event["claimId"]] = None if event["type"] == "claim_released" else event["environmentId"]
    removed = {e["environmentId"] for e in events if e["type"] == "removed"}
    assert not removed & set(holders.values()), f"claims held by removed environments: {holders}"


async def finish_lifecycle(service: Service, tmp_path: Path, environment_id: str) -> None:
    await service.wait_for(environment_id, "ready")
    await service.bb("thread", "archive", "t1")
    await service.wait_for(environment_id, "removed")
    assert ran(tmp_path, "setup") == 1 and ran(tmp_path, "teardown") == 1
    assert list((provider_dir(service) / "workspaces").iterdir()) == []
    await assert_consistent_log(service, environment_id)


async def test_killed_during_create_the_create_is_asked_again_and_hooks_run_once(tmp_path, project):
    service = await start(tmp_path)
    try:
        environment_id = await spawn(service, project)
        await wait_for_call(service, "create t1 1")
        service.kill()
        await restart(service)
        await wait_for_call(service, "create t1 1", count=2)  # the same attempt, asked again
        await open_gates(service, "create", "remove")
        await finish_lifecycle(service, tmp_path, environment_id)
    finally:
        await service.stop()


@pytest.mark.parametrize("crash_at", ["create-returned", "created-recorded"])
async def test_killed_around_created_the_environment_goes_on(tmp_path, project, crash_at):
    service = await start(tmp_path, crash_at)
    try:
        environment_id = await spawn(service, project)
        await open_gates(service, "create", "remove")  # only now: the crash must not swallow the reply
        await died(service)
        await restart(service)
        await finish_lifecycle(service, tmp_path, environment_id)
    finally:
        await service.stop()


async def test_a_personal_workspace_killed_before_its_creation_was_saved_is_searched_for_a_setup_script(tmp_path):
    """Killed between making the directory and saving Created: the retry finds the directory there,
    so it can no longer say it made it empty, and the host looks for a setup script (put there
    meanwhile), which runs once."""
    service = await start(tmp_path, "create-returned")
    marker = tmp_path / "setup-ran"
    try:
        # The creation is quick enough that the kill may come before the spawn's answer: not waited for.
        await service.bb(
            "thread", "spawn", "--json", "--environment-provider", "personal-workspace", "--thread-id", "mine"
        )
        await died(service)
        workspace = service.data_dir / "providers" / "personal-workspace" / "workspaces" / "mine"
        (workspace / ".bb-env-setup.sh").write_text(f"echo ran >> {marker}\n")
        await restart(service)
        thread = await service.wait_for_thread("mine", having="environmentId")
        ready = await service.wait_for(thread["environmentId"], "ready")
        assert ready["hooks"]["setup"]["status"] == "succeeded"
        assert marker.read_text().split() == ["ran"]
    finally:
        await service.stop()


async def test_killed_during_setup_the_running_hook_is_joined_not_run_again(tmp_path, project):
    service, environment_id = await start_with_setup_held(tmp_path, project)
    try:
        await service.wait_for(environment_id, lambda e: "setup started" in e["transcript"])
        service.kill()
        (tmp_path / "hold-setup").unlink()  # the hook finishes while the service is down
        await restart(service)
        # The restarted service replays the hook's log; the line stored before the crash stays single.
        finished = await service.wait_for(environment_id, lambda e: "setup done" in e["transcript"])
        assert finished["transcript"].count("setup started") == 1
        await finish_lifecycle(service, tmp_path, environment_id)
    finally:
        await service.stop()


@pytest.mark.parametrize("crash_at", ["setup-finished", "teardown-finished", "remove-returned"])
async def test_killed_after_a_step_finished_its_outcome_is_recorded_once(tmp_path, project, crash_at):
    service = await start(tmp_path, crash_at)
    try:
        environment_id = await spawn(service, project)
        await open_gates(service, "create")  # only now: the crash must not swallow the reply
        if crash_at != "setup-finished":
            await service.wait_for(environment_id, "ready")
            (tmp_path / "hold-teardown").touch()  # nor the archive's
            assert (await service.bb("thread", "archive", "t1")).returncode == 0
            (tmp_path / "hold-teardown").unlink()
        await open_gates(service, "remove")
        await died(service)
        await restart(service)
        if crash_at == "setup-finished":
            await finish_lifecycle(service, tmp_path, environment_id)
        else:
            await service.wait_for(environment_id, "removed")
            assert ran(tmp_path, "setup") == 1 and ran(tmp_path, "teardown") == 1
            await assert_consistent_log(service, environment_id)
    finally:
        await service.stop()


async def test_killed_during_teardown_the_hook_is_joined_and_removal_finishes(tmp_path, project):
    service = await start(tmp_path)
    try:
        await open_gates(service, "create", "remove")
        environment_id = await spawn(service, project)
        await service.wait_for(environment_id, "ready")
        (tmp_path / "hold-teardown").touch()
        await service.bb("thread", "archive", "t1")
        await wait_for_file(tmp_path / "markers" / "teardown")
        service.kill()
        (tmp_path / "hold-teardown").unlink()
        await restart(service)
        await service.wait_for(environment_id, "removed")
        assert ran(tmp_path, "setup") == 1 and ran(tmp_path, "teardown") == 1
        await assert_consistent_log(service, environment_id)
    finally:
        await service.stop()


async def test_killed_during_remove_the_removal_is_retried_until_done(tmp_path, project):
    service = await start(tmp_path)
    try:
        await open_gates(service, "create")
        environment_id = await spawn(service, project)
        await service.wait_for(environment_id, "ready")
        await service.bb("thread", "archive", "t1")
        await wait_for_call(service, "remove t1")
        service.kill()
        await restart(service)
        await open_gates(service, "remove")
        await service.wait_for(environment_id, "removed")
        assert ran(tmp_path, "teardown") == 1
        await assert_consistent_log(service, environment_id)
    finally:
        await service.stop()


async def test_killed_between_store_and_bus_no_event_is_lost_or_doubled(tmp_path, project):
    service = await start(tmp_path, "relay-published")
    try:
        await open_gates(service, "create", "remove")
        spawning = asyncio.create_task(
            service.bb(
                "thread", "spawn", "--environment-provider", "gated", "--project", str(project), "--thread-id", "t1"
            )
        )
        await died(service)
        spawning.cancel()  # its reply died with the service; the recorded request is resumed
        await restart(service)
        environment_id = (await service.wait_for_thread("t1", having="environmentId"))["environmentId"]
        await finish_lifecycle(service, tmp_path, environment_id)
        exported = (await service.bb("events", "export")).stdout.splitlines()
        assert len(exported) == len(set(exported))
    finally:
        await service.stop()


async def test_archived_while_creating_waits_for_create_then_removes_everything(tmp_path, project):
    service = await start(tmp_path)
    try:
        await open_gates(service, "remove")
        environment_id = await spawn(service, project)
        await wait_for_call(service, "create t1 1")
        await service.bb("thread", "archive", "t1")
        removed = await service.wait_for(environment_id, "removed")
        assert removed["hooks"]["setup"]["status"] is None
        assert ran(tmp_path, "setup") == 0
        lines = calls(provider_dir(service))
        assert lines[0].startswith("create") and lines[-1].startswith("remove t1")
        await assert_consistent_log(service, environment_id)
    finally:
        await service.stop()


async def test_nats_server_killed_and_restarted_mid_flow_loses_and_doubles_nothing(tmp_path, project):
    service = await start(tmp_path)
    try:
        await open_gates(service, "create", "remove")
        first = await spawn(service, project, "t1")
        await service.wait_for(first, "ready")
        subprocess.run(["kill", "-9", str(service.info["natsPid"])], check=True)
        for _ in range(100):  # "unreachable" (4) until the service has restarted its server and reconnected
            archived = await service.bb("thread", "archive", "t1")
            if archived.returncode != 4:
                break
            await asyncio.sleep(0.2)
        assert archived.returncode == 0, archived.stderr
        await service.wait_for(first, "removed", timeout=60)
        second = await spawn(service, project, "t2")
        await service.wait_for(second, "ready")
        exported = (await service.bb("events", "export")).stdout.splitlines()
        assert len(exported) == len(set(exported))
        environments = (await service.bb("environment", "list", "--all", "--json")).json()["environments"]
        assert sorted(e["status"] for e in environments) == ["ready", "removed"]
        await assert_consistent_log(service, first)
    finally:
        await service.stop()


async def test_archived_while_setup_runs_the_hook_is_stopped_before_anything_is_removed(tmp_path, project):
    service, environment_id = await start_with_setup_held(tmp_path, project)
    try:
        await service.bb("thread", "archive", "t1")
        removed = await service.wait_for(environment_id, "removed")
        assert removed["hooks"]["setup"]["status"] == "failed"
        assert "setup done" not in removed["transcript"]  # stopped mid-script, never finished
        assert ran(tmp_path, "setup") == 1
        # The script loops while hold-setup exists (it still does): only a kill of its group ended it.
        assert not [c for c in _command_lines() if str(provider_dir(service)) in c and ".bb-env-setup.sh" in c]
        await assert_consistent_log(service, environment_id)
    finally:
        await service.stop()


def _command_lines() -> list[str]:
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return lines


async def test_killed_during_a_worktree_checkout_the_worktree_is_made_again_and_set_up_once(tmp_path, git_repo, git):
    """The killed service's `git worktree add` checks out on, and once done, dies writing to the dead
    service's pipe and deletes the worktree: the restarted service must neither take the half-made
    worktree for done (a setup in half a tree, then no workspace) nor have it deleted under it."""
    hold, checkouts, setups = tmp_path / "hold-checkout", tmp_path / "checkouts", tmp_path / "setups"
    (git_repo / ".gitattributes").write_text("slow.txt filter=slow\n")
    (git_repo / "slow.txt").write_text("smudged\n")
    (git_repo / ".bb-env-setup.sh").write_text(f"pwd -P >> {setups}\n")
    git(git_repo, "add", ".")
    git(git_repo, "commit", "--quiet", "-m", "a file checked out through a filter that can be held")
    git(
        git_repo,
        "config",
        "filter.slow.smudge",
        f"echo started >> {checkouts}; while [ -e {hold} ]; do sleep 0.02; done; cat",
    )
    hold.touch()
    service = Service(tmp_path / "data", service_environment(tmp_path / "data"))
    await service.start()
    try:
        environment_id = await service.spawn("git-worktree", project=git_repo, thread_id="t1")
        await eventually(lambda: lines(checkouts) == 1, "the checkout's start")
        service.kill()
        await service.start()
        # Either the worktree, still held in its first checkout, was taken for done, or it is checked out again.
        await service.wait_for(environment_id, lambda e: e["status"] == "ready" or lines(checkouts) == 2)
        hold.unlink()
        ready = await service.wait_for(environment_id, "ready")
        await eventually(lambda: not worktree_adds_in(git_repo), "the end of every `git worktree add`")

        workspace = Path(ready["path"]).resolve()
        assert (workspace / "slow.txt").read_text() == "smudged\n"
        listed = git(git_repo, "worktree", "list", "--porcelain").split("\n\n")
        assert [entry for entry in listed if entry.startswith(f"worktree {workspace}\n") and "locked" not in entry]
        assert (setups.read_text().splitlines()) == [str(workspace)]
    finally:
        await service.stop()


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def worktree_adds_in(repo: Path) -> list[int]:
    return [
        pid
        for pid, arguments in command_lines()
        if str(repo) in arguments and "worktree" in arguments and "add" in arguments
    ]


async def test_killed_just_after_saving_a_worktrees_work_the_removal_keeps_that_one_save(tmp_path, git_repo, git):
    service = Service(
        tmp_path / "data",
        service_environment(tmp_path / "data", BB_CRASH_AT="work-saved", BB_SAVED_WORK_MAX_BYTES="100000"),
    )
    await service.start()
    try:
        environment_id = await service.spawn("git-worktree", project=git_repo, thread_id="t1")
        workspace = Path((await service.wait_for(environment_id, "ready"))["path"])
        (workspace / "unsaved.txt").write_text("an agent's work, committed nowhere\n")
        dump = b"a tenant's database dump\n" * 10_000  # 250000 bytes: more than BB_SAVED_WORK_MAX_BYTES
        (workspace / "dump.sql").write_bytes(dump)
        await service.bb("thread", "archive", "t1")
        await died(service)
        saved_ref = f"refs/bb/saved/{environment_id}"
        first_save = git(git_repo, "rev-parse", saved_ref)
        assert workspace.exists()  # killed between the save and the removal

        await restart(service)
        removed = await service.wait_for(environment_id, "removed")

        assert removed["savedRef"] == saved_ref
        assert (
            git(git_repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/bb") == f"{saved_ref} {first_save}"
        )
        assert git(git_repo, "show", f"{saved_ref}:unsaved.txt") == "an agent's work, committed nowhere"
        assert not workspace.exists()
        shown = await service.bb("environment", "show", environment_id)
        assert f"saved work: {saved_ref}  (git worktree add <dir> {saved_ref})" in shown.stdout
        exported = [json.loads(line) for line in (await service.bb("events", "export")).stdout.splitlines()]
        saves = [e for e in exported if e.get("environmentId") == environment_id and e["type"] == "work_saved"]
        assert [e["savedRef"] for e in saves] == [saved_ref]
        [removed_event] = [e for e in exported if e.get("environmentId") == environment_id and e["type"] == "removed"]
        assert removed_event["notSaved"] == [{"path": "dump.sql", "bytes": len(dump)}]
        assert git(git_repo, "ls-tree", "--name-only", saved_ref).splitlines() == ["README.md", "unsaved.txt"]
        dump_blob = (
            subprocess.run(
                ["git", "-C", str(git_repo), "hash-object", "--stdin"], input=dump, capture_output=True, check=True
            )
            .stdout.decode()
            .strip()
        )
        assert subprocess.run(["git", "-C", str(git_repo), "cat-file", "-e", dump_blob]).returncode != 0
        transcript = (await service.bb("environment", "logs", environment_id)).stdout
        assert (
            "Not saved, being larger than BB_SAVED_WORK_MAX_BYTES (97.7 KiB): dump.sql (244.1 KiB). They are "
            f"not in the saved work {saved_ref}: they are deleted with the worktree {workspace}." in transcript
        )
        await assert_consistent_log(service, environment_id)
    finally:
        await service.stop()
