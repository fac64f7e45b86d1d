"""Hook runs with real bash scripts, real supervisors and real signals."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bb_environments.domain.hook_operations import HookOutcome
from bb_environments.hooks.records import HeldOutcome, HookIdentityMismatch, HookRecord, HookRecords, SyncLevel, now_iso
from bb_environments.hooks.runner import HookRunner
from bb_environments.providers.host.processes import process_start_ticks, start_ticks_of_child
from tests.support.small_disk import small_disk

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 10.0


async def wait_until(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


def alive(pid: int) -> bool:
    return process_start_ticks(pid) is not None


def pid_in(path: Path) -> int:
    return int(path.read_text())


class Output:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.offsets: list[int] = []

    async def __call__(self, line: str, offset: int) -> None:
        self.lines.append(line)
        self.offsets.append(offset)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def records_dir(tmp_path: Path) -> Path:
    return tmp_path / "hook-records"


def write_setup(workspace: Path, body: str) -> None:
    (workspace / ".bb-env-setup.sh").write_text(textwrap.dedent(body))


def executions(workspace: Path) -> int:
    marker = workspace / "marker"
    return len(marker.read_text().splitlines()) if marker.exists() else 0


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_success_delivers_output_lines_in_order(records_dir: Path, workspace: Path, sync: SyncLevel) -> None:
    write_setup(workspace, "echo one\necho two >&2\necho \"cwd=$(pwd)\"\nprintf 'no newline'\n")
    output = Output()

    outcome = await HookRunner(records_dir, timeout_s=10, sync=sync).run("op", "setup", workspace, output)

    assert outcome == HookOutcome("succeeded", 0, None)
    assert output.lines == ["one", "two", f"cwd={workspace}", "no newline"]
    assert output.offsets == [0, 4, 8, 13 + len(str(workspace))]  # where each starts in the log


async def test_of_a_backlog_longer_than_the_transcript_keeps_only_the_newest_lines_are_delivered_after_a_count(
    records_dir: Path, workspace: Path
) -> None:
    write_setup(workspace, "seq 1 5000\n")
    await HookRunner(records_dir, timeout_s=10).run("op", "setup", workspace, Output())
    replayed = Output()

    # A restarted runner replays the finished log from its start: all 5000 lines are its backlog.
    outcome = await HookRunner(records_dir, timeout_s=10, transcript_lines_kept=100).run(
        "op", "setup", workspace, replayed
    )

    assert outcome == HookOutcome("succeeded", 0, None)
    left_out = len("".join(f"{n}\n" for n in range(1, 4902)))
    assert replayed.lines == [
        f"[bb: 4901 lines ({left_out} bytes) of output not in the transcript, which keeps the last 100 of an "
        "environment: bb environment logs --hook-output has them]",
        *map(str, range(4902, 5001)),
    ]
    assert replayed.offsets[:2] == [0, left_out]  # each line still named by its place in the log


WITHHELD = {
    "BB_PROJECT_ID": "p",
    "NATS_URL": "nats://x",
    "MODAL_TOKEN_SECRET": "s",
    "POSTGRES_PASSWORD": "pg",
    "ENVIRONMENTS_POSTGRES_PASSWORD": "app-pg",
    "PGPASSWORD": "libpq",
    "CIPHER_KEY": "cipher",
}


async def test_script_environment_drops_service_secrets_and_keeps_the_variables_given_it(
    records_dir: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in WITHHELD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("BB_ENVIRONMENT_ID", "the service's own")
    monkeypatch.setenv("KEPT_VARIABLE", "kept")
    write_setup(
        workspace,
        "".join(f'echo "{name}=[${name}]"\n' for name in [*WITHHELD, "KEPT_VARIABLE"])
        + 'echo "[$BB_ENVIRONMENT_ID]"\n',
    )
    output = Output()

    await HookRunner(records_dir, timeout_s=10).run(
        "op", "setup", workspace, output, "env-1", {"BB_ENVIRONMENT_ID": "env-1"}
    )

    assert output.lines == [*(f"{name}=[]" for name in WITHHELD), "KEPT_VARIABLE=[kept]", "[env-1]"]


NATS_CREDENTIAL_VARIABLES = (
    "BB_NATS_CREDS",
    "BB_NATS_NKEY",
    "BB_NATS_USER",
    "BB_NATS_PASSWORD",
    "BB_NATS_TOKEN",
    "BB_NATS_CA",
)


async def test_neither_a_hook_nor_the_process_it_runs_under_holds_the_service_credentials(
    records_dir: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NATS_CREDENTIAL_VARIABLES:
        monkeypatch.setenv(name, f"planted-{name}")
    # The supervisor, the hook's parent, is forked from the launcher: it holds the launcher's environment.
    outcome, lines = await run_setup_once(records_dir, workspace, "env\ntr '\\0' '\\n' < /proc/$PPID/environ\n")

    assert outcome.status == "succeeded"
    assert len([line for line in lines if line.startswith("PATH=")]) == 2  # both were dumped
    assert [line for line in lines if "planted-" in line] == []


async def run_setup_once(records_dir: Path, workspace: Path, script: str) -> tuple[HookOutcome, list[str]]:
    """`script` run as the setup hook by a runner of its own, closed afterwards: its outcome and lines."""
    write_setup(workspace, script)
    output = Output()
    runner = HookRunner(records_dir, timeout_s=10)
    try:
        return await runner.run("op", "setup", workspace, output), output.lines
    finally:
        runner.close()


async def test_a_hook_inherits_no_descriptor_but_its_standard_streams(records_dir: Path, workspace: Path) -> None:
    # Listed by another process (ls), so the listing's own directory descriptor is not among them,
    # and by one command, not a pipeline, whose pipes bash would hold while it starts its parts;
    # 255 is bash's hold on its script.
    outcome, lines = await run_setup_once(records_dir, workspace, "ls /proc/$$/fd\n")

    assert outcome.status == "succeeded"
    assert sorted(lines, key=int) == ["0", "1", "2", "255"]


async def test_failure_reports_exit_code(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo broken\nexit 3\n")

    outcome = await HookRunner(records_dir, timeout_s=10).run("op", "setup", workspace, Output())

    assert outcome.status == "failed"
    assert outcome.exit_code == 3
    assert outcome.message is not None and "exit code 3" in outcome.message


async def test_death_by_signal_is_a_failure(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "kill -KILL $$\n")

    outcome = await HookRunner(records_dir, timeout_s=10).run("op", "setup", workspace, Output())

    assert outcome == HookOutcome("failed", None, ".bb-env-setup.sh exited via signal SIGKILL")


async def test_missing_script_is_skipped_and_stays_skipped(records_dir: Path, workspace: Path) -> None:
    runner = HookRunner(records_dir, timeout_s=10)

    first = await runner.run("op", "teardown", workspace, Output())
    (workspace / ".bb-env-teardown.sh").write_text("echo ran >> marker\n")
    second = await runner.run("op", "teardown", workspace, Output())

    assert first == second == HookOutcome("skipped", None, "no .bb-env-teardown.sh")
    assert executions(workspace) == 0


async def test_timeout_kills_the_script_and_its_children(records_dir: Path, workspace: Path) -> None:
    write_setup(
        workspace,
        """\
        sleep 30 &
        echo $! > background.pid
        bash -c 'echo $$ > nested.pid; exec sleep 30' &
        wait
        """,
    )

    outcome = await HookRunner(records_dir, timeout_s=0.5).run("op", "setup", workspace, Output())

    assert outcome.status == "timed_out"
    assert outcome.message == ".bb-env-setup.sh timed out after 0.5s"
    assert not alive(pid_in(workspace / "background.pid"))
    assert not alive(pid_in(workspace / "nested.pid"))


async def test_cancel_while_running_stops_the_group_and_it_never_runs_again(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo ran >> marker\nsleep 30 &\necho $! > background.pid\nwait\n")
    runner = HookRunner(records_dir, timeout_s=30)
    running = asyncio.ensure_future(runner.run("op", "setup", workspace, Output()))
    await wait_until(lambda: (workspace / "background.pid").exists() and executions(workspace) == 1)

    assert await runner.cancel("op") == "terminated"
    outcome = await running

    assert outcome.status == "cancelled"
    assert not alive(pid_in(workspace / "background.pid"))
    assert (await runner.run("op", "setup", workspace, Output())).status == "cancelled"
    restarted = HookRunner(records_dir, timeout_s=30)
    assert (await restarted.run("op", "setup", workspace, Output())).status == "cancelled"
    assert await restarted.cancel("op") == "finished"
    assert executions(workspace) == 1


async def test_cancel_before_start_means_it_never_runs(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo ran >> marker\n")
    runner = HookRunner(records_dir, timeout_s=10)

    assert await runner.cancel("op") == "never-started"
    outcome = await runner.run("op", "setup", workspace, Output())

    assert outcome.status == "cancelled"
    assert executions(workspace) == 0
    assert runner.status("op") is None


async def test_repeated_run_replays_the_outcome(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo ran >> marker\necho hello\nexit 0\n")
    runner = HookRunner(records_dir, timeout_s=10)
    first_output, again_output, restarted_output = Output(), Output(), Output()

    first = await runner.run("op", "setup", workspace, first_output)
    again = await runner.run("op", "setup", workspace, again_output)
    restarted = await HookRunner(records_dir, timeout_s=10).run("op", "setup", workspace, restarted_output)

    assert first == again == restarted == HookOutcome("succeeded", 0, None)
    assert executions(workspace) == 1
    assert first_output.lines == ["hello"]
    assert again_output.lines == []
    assert restarted_output.lines == ["hello"]
    assert restarted_output.offsets == first_output.offsets  # the same line, known as the same


async def test_concurrent_runs_coalesce(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo ran >> marker\nsleep 0.3\nexit 4\n")
    runner = HookRunner(records_dir, timeout_s=10)

    outcomes = await asyncio.gather(*(runner.run("op", "setup", workspace, Output()) for _ in range(3)))

    assert {outcome.status for outcome in outcomes} == {"failed"}
    assert executions(workspace) == 1


async def test_a_different_hook_under_the_same_operation_is_refused(records_dir: Path, workspace: Path) -> None:
    runner = HookRunner(records_dir, timeout_s=10)
    await runner.run("op", "setup", workspace, Output())

    with pytest.raises(HookIdentityMismatch):
        await runner.run("op", "teardown", workspace, Output())


@pytest.mark.parametrize("sync, synced", [("normal", False), ("full", True)])
def test_record_writes_wait_for_the_disk_only_at_the_full_sync_level(
    records_dir: Path, fsynced: list[str], sync: SyncLevel, synced: bool
) -> None:
    """`normal` survives a kill -9 of any process without an fsync (the kernel holds the rename);
    `full` survives power loss too: the file and then its directory are on disk before a write returns."""
    records = HookRecords(records_dir, sync)
    records.write(HookRecord(operation_id="a", kind="setup", workspace="/w", script="/w/s", started_at=now_iso()))
    records.tombstone("a")

    assert records.read("a") is not None and records.is_tombstoned("a")
    if synced:
        # The new shard's parent, which now names it; then each write: its temporary file
        # (renamed since), then the shard that now names it.
        shard = str(records.directory / hashlib.sha256(b"a").hexdigest()[:2])
        assert len(fsynced) == 5
        assert fsynced[0] == str(records.directory) and fsynced[2] == fsynced[4] == shard
    else:
        assert fsynced == []


def test_a_record_stored_under_another_operation_is_refused(records_dir: Path) -> None:
    records = HookRecords(records_dir)
    records.write(HookRecord(operation_id="a", kind="setup", workspace="/w", script="/w/s", started_at=now_iso()))
    stored = next(records_dir.glob("*/*.json"))
    other = hashlib.sha256(b"b").hexdigest()
    (records_dir / other[:2]).mkdir(exist_ok=True)
    stored.rename(records_dir / other[:2] / (other + ".json"))

    with pytest.raises(HookIdentityMismatch):
        records.read("b")


SERVICE = """\
import asyncio, sys
from pathlib import Path
from bb_environments.hooks.runner import HookRunner

async def ignore(line, offset):
    pass

asyncio.run(HookRunner(Path(sys.argv[1]), timeout_s=30).run("op", "setup", Path(sys.argv[2]), ignore))
"""


def start_service(records_dir: Path, workspace: Path) -> subprocess.Popen:
    """A service process running the workspace's setup hook as operation "op", to be killed as a crash."""
    return subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(records_dir), str(workspace)], cwd=REPO_ROOT, start_new_session=True
    )


async def test_after_a_service_crash_the_running_hook_is_joined(records_dir: Path, workspace: Path) -> None:
    write_setup(
        workspace,
        """\
        echo ran >> marker
        echo before
        while [ ! -e release ]; do sleep 0.02; done
        echo after
        """,
    )
    service = start_service(records_dir, workspace)
    try:
        await wait_until(lambda: executions(workspace) == 1)
    finally:
        service.kill()
        await asyncio.to_thread(service.wait)
    output = Output()

    joined = asyncio.ensure_future(HookRunner(records_dir, timeout_s=30).run("op", "setup", workspace, output))
    await wait_until(lambda: output.lines == ["before"])
    assert not joined.done()
    (workspace / "release").touch()

    assert await joined == HookOutcome("succeeded", 0, None)
    assert output.lines == ["before", "after"]
    assert executions(workspace) == 1


@pytest.fixture
def bystander():
    """A live process in its own group that a stale record will name."""
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def forge_running_record(records_dir: Path, workspace: Path, pid: int, started_at: int) -> None:
    HookRecords(records_dir).write(
        HookRecord(
            operation_id="op",
            kind="setup",
            workspace=str(workspace),
            script=str(workspace / ".bb-env-setup.sh"),
            started_at=now_iso(),
            supervisor_pid=pid,
            supervisor_started_at=started_at,
            script_pid=pid,
            script_started_at=started_at,
        )
    )


async def test_cancel_never_signals_a_reused_pid(
    records_dir: Path, workspace: Path, bystander: subprocess.Popen[bytes]
) -> None:
    real_start = process_start_ticks(bystander.pid)
    assert real_start is not None
    forge_running_record(records_dir, workspace, bystander.pid, real_start - 1)
    runner = HookRunner(records_dir, timeout_s=10)

    assert await runner.cancel("op") == "terminated"

    assert alive(bystander.pid)
    record = runner.status("op")
    assert record is not None and record.outcome == "cancelled"


async def test_recovery_never_signals_a_reused_pid(
    records_dir: Path, workspace: Path, bystander: subprocess.Popen[bytes]
) -> None:
    real_start = process_start_ticks(bystander.pid)
    assert real_start is not None
    forge_running_record(records_dir, workspace, bystander.pid, real_start + 1)

    outcome = await HookRunner(records_dir, timeout_s=10).run("op", "setup", workspace, Output())

    assert outcome.status == "interrupted"
    assert alive(bystander.pid)


# The launcher: one long-lived helper per runner forks the supervisors.


def children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def gone(pid: int, started_at: int | None) -> bool:
    """No process, not even a zombie, is that pid with that start time any more."""
    return started_at is None or start_ticks_of_child(pid) != started_at


def stopped(pid: int, started_at: int | None) -> bool:
    """No live process is that pid with that start time (an unreaped orphan may linger as a zombie)."""
    return started_at is None or process_start_ticks(pid) != started_at


def identity(pid: int) -> tuple[int, int | None]:
    return pid, start_ticks_of_child(pid)


def launcher_of(runner: HookRunner) -> int:
    pid = runner._launcher.pid
    assert pid is not None
    return pid


async def idle_spare(runner: HookRunner, last_operation_id: str) -> tuple[int, int | None]:
    """The launcher's only child once the last hook's supervisor is reaped: its spare."""
    record = runner.status(last_operation_id)
    assert record is not None and record.supervisor_pid is not None
    await wait_until(lambda: gone(record.supervisor_pid, record.supervisor_started_at))
    await wait_until(lambda: len(children_of(launcher_of(runner))) == 1)
    [spare] = children_of(launcher_of(runner))
    return identity(spare)


async def test_supervisors_are_reaped_and_closing_the_runner_stops_its_launcher(
    records_dir: Path, workspace: Path
) -> None:
    write_setup(workspace, "echo hi\n")
    runner = HookRunner(records_dir, timeout_s=10)
    assert (await runner.run("op", "setup", workspace, Output())).status == "succeeded"
    launcher = identity(launcher_of(runner))
    spares = [await idle_spare(runner, "op")]

    runner.close()

    assert gone(*launcher)
    # Orphaned when the launcher exits: reaped by whoever adopts orphans here, maybe not at once.
    await wait_until(lambda: all(stopped(*spare) for spare in spares))
    # A closed runner starts a new launcher when it needs one.
    assert (await runner.run("op2", "setup", workspace, Output())).status == "succeeded"
    runner.close()


async def test_prepare_starts_the_launcher_ahead_of_the_first_hook(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo hi\n")
    runner = HookRunner(records_dir, timeout_s=10)

    await runner.prepare()
    launcher = launcher_of(runner)

    assert (await runner.run("op", "setup", workspace, Output())).status == "succeeded"
    assert launcher_of(runner) == launcher
    runner.close()


async def test_a_collected_runner_leaves_no_launcher_behind(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo hi\n")
    runner = HookRunner(records_dir, timeout_s=10)
    assert (await runner.run("op", "setup", workspace, Output())).status == "succeeded"
    launcher = identity(launcher_of(runner))
    spares = [await idle_spare(runner, "op")]

    del runner
    gc.collect()

    assert gone(*launcher)
    # Orphaned when the launcher exits: reaped by whoever adopts orphans here, maybe not at once.
    await wait_until(lambda: all(stopped(*spare) for spare in spares))


async def test_a_dead_launcher_or_spare_is_replaced(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo hi\n")
    runner = HookRunner(records_dir, timeout_s=10)
    assert (await runner.run("op1", "setup", workspace, Output())).status == "succeeded"
    first = identity(launcher_of(runner))
    os.kill(first[0], signal.SIGKILL)
    await wait_until(lambda: stopped(*first))

    assert (await runner.run("op2", "setup", workspace, Output())).status == "succeeded"
    second = launcher_of(runner)
    assert second != first[0]
    spare = await idle_spare(runner, "op2")
    os.kill(spare[0], signal.SIGKILL)
    await wait_until(lambda: stopped(*spare))

    assert (await runner.run("op3", "setup", workspace, Output())).status == "succeeded"
    assert launcher_of(runner) == second
    runner.close()


async def test_a_hook_starts_without_a_round_trip_through_the_launcher(records_dir: Path, workspace: Path) -> None:
    """The runner gives the request to the spare the launcher announced ahead of time: a stopped
    launcher does not hold a hook up, it only has to fork the next spare before the hook after."""
    write_setup(workspace, "echo ran >> marker\n")
    runner = HookRunner(records_dir, timeout_s=10)
    assert (await runner.run("op1", "setup", workspace, Output())).status == "succeeded"
    spare, _ = await idle_spare(runner, "op1")
    launcher = launcher_of(runner)
    os.kill(launcher, signal.SIGSTOP)
    try:
        outcome = await asyncio.wait_for(runner.run("op2", "setup", workspace, Output()), DEADLINE_S)
    finally:
        os.kill(launcher, signal.SIGCONT)

    assert outcome.status == "succeeded"

    record = runner.status("op2")
    assert record is not None and record.supervisor_pid == spare
    assert executions(workspace) == 2
    assert (await runner.run("op3", "setup", workspace, Output())).status == "succeeded"
    assert launcher_of(runner) == launcher
    runner.close()


async def test_a_stray_sigterm_to_the_idle_spare_cancels_nothing(records_dir: Path, workspace: Path) -> None:
    write_setup(workspace, "echo hi\n")
    runner = HookRunner(records_dir, timeout_s=10)
    assert (await runner.run("op1", "setup", workspace, Output())).status == "succeeded"
    spare, _ = await idle_spare(runner, "op1")
    os.kill(spare, signal.SIGTERM)

    assert (await runner.run("op2", "setup", workspace, Output())).status == "succeeded"
    record = runner.status("op2")
    assert record is not None and record.supervisor_pid == spare
    runner.close()


async def test_scripts_get_the_environment_of_the_moment_they_run(
    records_dir: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_setup(workspace, 'echo "[$LATE_VARIABLE][$BB_LATE_SECRET]"\n')
    runner = HookRunner(records_dir, timeout_s=10)
    first, second = Output(), Output()
    await runner.run("op1", "setup", workspace, first)
    monkeypatch.setenv("LATE_VARIABLE", "late")
    monkeypatch.setenv("BB_LATE_SECRET", "s")

    await runner.run("op2", "setup", workspace, second)

    assert first.lines == ["[][]"]
    assert second.lines == ["[late][]"]
    runner.close()


RUN_AND_REPORT_LAUNCHER = """\
import asyncio, sys
from pathlib import Path
from bb_environments.hooks.runner import HookRunner

async def ignore(line, offset):
    pass

async def main():
    runner = HookRunner(Path(sys.argv[1]), timeout_s=30)
    outcome = await runner.run(sys.argv[3], "setup", Path(sys.argv[2]), ignore)
    print(outcome.status, runner._launcher.pid)

asyncio.run(main())
"""


async def test_after_a_service_crash_its_launcher_is_gone_and_a_new_service_starts_its_own(
    records_dir: Path, workspace: Path
) -> None:
    write_setup(
        workspace,
        """\
        echo ran >> marker
        while [ ! -e release ]; do sleep 0.02; done
        echo after
        """,
    )
    service = start_service(records_dir, workspace)
    try:
        await wait_until(lambda: executions(workspace) == 1)
        [launcher_pid] = children_of(service.pid)
        launcher = identity(launcher_pid)
        # The running hook's supervisor and the spare.
        await wait_until(lambda: len(children_of(launcher_pid)) == 2)
        spares = [identity(pid) for pid in children_of(launcher_pid)]
    finally:
        service.kill()
        await asyncio.to_thread(service.wait)
    await wait_until(lambda: stopped(*launcher))
    record = HookRecords(records_dir).read("op")
    assert record is not None and record.supervisor_pid is not None
    supervisor = (record.supervisor_pid, record.supervisor_started_at)
    assert supervisor in spares
    await wait_until(lambda: all(stopped(*spare) for spare in spares if spare != supervisor))
    assert not stopped(*supervisor)

    other_workspace = workspace.parent / "other-workspace"
    other_workspace.mkdir()
    write_setup(other_workspace, "echo ran >> marker\n")
    second_service = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", RUN_AND_REPORT_LAUNCHER, str(records_dir), str(other_workspace), "op2"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    status, second_launcher = second_service.stdout.split()
    assert status == "succeeded"
    assert int(second_launcher) != launcher[0]
    await wait_until(lambda: not alive(int(second_launcher)))
    assert executions(other_workspace) == 1

    (workspace / "release").touch()
    joined = await HookRunner(records_dir, timeout_s=30).run("op", "setup", workspace, Output())
    assert joined == HookOutcome("succeeded", 0, None)
    assert executions(workspace) == 1


async def test_an_outcome_the_full_disk_refuses_is_held_by_its_supervisor_until_written(
    tmp_path: Path, workspace: Path
) -> None:
    write_setup(
        workspace,
        """\
        echo ran >> marker
        while [ ! -e release ]; do sleep 0.02; done
        """,
    )
    with small_disk(tmp_path / "disk") as disk:
        records_dir = disk.path / "hook-records"
        runner = HookRunner(records_dir, timeout_s=30)
        running = asyncio.ensure_future(runner.run("op", "setup", workspace, Output()))
        await wait_until(lambda: executions(workspace) == 1)
        disk.fill()
        (workspace / "release").touch()

        assert await asyncio.wait_for(running, DEADLINE_S) == HookOutcome("succeeded", 0, None)
        records = HookRecords(records_dir)
        written = records.read("op")
        assert written is not None and written.finished_at is None  # the disk refused the outcome
        assert alive(written.supervisor_pid)
        # So does a runner that starts afresh, as after a service restart: it asks the supervisor.
        restarted = HookRunner(records_dir, timeout_s=30)
        rejoined = restarted.run("op", "setup", workspace, Output())
        assert await asyncio.wait_for(rejoined, DEADLINE_S) == HookOutcome("succeeded", 0, None)
        status = restarted.status("op")
        assert status is not None and status.outcome == "succeeded"

        disk.free()
        await wait_until(lambda: not alive(written.supervisor_pid))  # it wrote the outcome, then left
        runner.close()
        restarted.close()
        recorded = records.read("op")

    assert recorded is not None and recorded.outcome == "succeeded"
    assert executions(workspace) == 1


async def test_an_outcome_offered_by_another_process_than_the_supervisor_is_not_believed(
    records_dir: Path, workspace: Path, bystander: subprocess.Popen[bytes]
) -> None:
    real_start = process_start_ticks(bystander.pid)
    assert real_start is not None
    forge_running_record(records_dir, workspace, bystander.pid, real_start)
    records = HookRecords(records_dir)
    impostor = HeldOutcome(records, dataclasses.replace(records.read("op"), outcome="succeeded", finished_at=now_iso()))
    try:
        status = HookRunner(records_dir, timeout_s=10).status("op")
    finally:
        impostor.close()

    assert status is not None and status.finished_at is None


def refuse_first_write(runner: HookRunner, errno_: int) -> list[HookRecord]:
    """The records the runner asks to write; the disk refuses the first one."""
    write, asked = runner._records.write, []

    def refusing(record: HookRecord, *args, **kwargs) -> None:
        asked.append(dataclasses.replace(record))
        if len(asked) == 1:
            raise OSError(errno_, os.strerror(errno_))
        write(record, *args, **kwargs)

    runner._records.write = refusing
    return asked


async def test_an_adopting_record_the_full_disk_refuses_is_retried_with_a_new_supervisor(
    records_dir: Path, workspace: Path
) -> None:
    write_setup(workspace, "echo ran >> marker\n")
    runner = HookRunner(records_dir, timeout_s=30)
    asked = refuse_first_write(runner, errno.ENOSPC)
    try:
        outcome = await asyncio.wait_for(runner.run("op", "setup", workspace, Output()), DEADLINE_S)
    finally:
        runner.close()

    assert outcome == HookOutcome("succeeded", 0, None)
    assert executions(workspace) == 1
    # The refused record's supervisor never ran the script; the retry started and adopted its own.
    assert asked[0].supervisor_pid != asked[1].supervisor_pid


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("disk", ["has room", "is full"])
@pytest.mark.parametrize("stepped", [False, True], ids=["before its first step", "while its first step runs"])
async def test_a_run_cancelled_as_it_begins_leaks_neither_its_supervisor_nor_its_error(
    records_dir: Path, workspace: Path, disk: str, stepped: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # As the event loop's shutdown cancels every task: the run's task, right after it was asked for.
    write_setup(workspace, "echo ran >> marker\n")
    runner = HookRunner(records_dir, timeout_s=30)
    await runner.prepare()
    if disk == "is full":
        refuse_first_write(runner, errno.ENOSPC)
    before = open_fds()
    running = runner.start("op", "setup", workspace, Output())
    begun = runner._in_flight["op"].begun
    assert begun is not None
    [task] = asyncio.all_tasks() - {asyncio.current_task()}
    if stepped:
        await asyncio.sleep(0)  # one round of the loop: the task's first step, which waits for `begun`
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.wait([begun], timeout=DEADLINE_S)
    assert begun.done()
    del begun, task, running
    gc.collect()

    assert "never retrieved" not in caplog.text
    assert open_fds() == before
    runner.close()
