"""Where hook records lie on disk: sharded by a prefix of the operation id's hash, nothing at all for
a hook that never ran, and records an earlier release left in the flat layout still read, joined
and deleted (real supervisors, real processes)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bb_environments.domain.hook_operations import HookOutcome
from bb_environments.hooks.records import HookRecord, HookRecords, now_iso
from bb_environments.hooks.runner import HookRunner
from bb_environments.providers.host.processes import process_start_ticks
from tests.unit.test_hooks import Output, executions, wait_until, write_setup


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def records_dir(tmp_path: Path) -> Path:
    return tmp_path / "hook-records"


def files_in(records_dir: Path) -> list[Path]:
    return sorted(path for path in records_dir.rglob("*") if path.is_file())


def digest(operation_id: str) -> str:
    return hashlib.sha256(operation_id.encode()).hexdigest()


def write_flat(records_dir: Path, record: HookRecord, log: bytes = b"") -> None:
    """What a release before the sharded layout left: the files straight in the records directory."""
    records_dir.mkdir(mode=0o700, exist_ok=True)
    (records_dir / f"{digest(record.operation_id)}.json").write_text(json.dumps(dataclasses.asdict(record)))
    if log:
        (records_dir / f"{digest(record.operation_id)}.log").write_bytes(log)


async def test_a_hook_whose_script_is_missing_leaves_no_file_and_answers_skipped_again(
    records_dir: Path, workspace: Path
) -> None:
    runner = HookRunner(records_dir, timeout_s=10)
    try:
        first = await runner.run("env-1.teardown", "teardown", workspace, Output())
        again = await runner.run("env-1.teardown", "teardown", workspace, Output())
    finally:
        runner.close()

    assert first == again == HookOutcome("skipped", None, "no .bb-env-teardown.sh")
    assert files_in(records_dir) == []


async def test_records_lie_in_shards_named_by_the_start_of_the_operation_s_hash(
    records_dir: Path, workspace: Path
) -> None:
    write_setup(workspace, "echo ran >> marker\n")
    runner = HookRunner(records_dir, timeout_s=10)
    try:
        for n in range(3):
            assert (await runner.run(f"op-{n}", "setup", workspace, Output())).status == "succeeded"
    finally:
        runner.close()

    expected = sorted(
        records_dir / digest(f"op-{n}")[:2] / f"{digest(f'op-{n}')}{suffix}"
        for n in range(3)
        for suffix in (".json", ".log")
    )
    assert files_in(records_dir) == expected
    assert [path for path in records_dir.iterdir() if path.is_file()] == []


async def test_a_finished_record_in_the_flat_layout_replays_its_outcome_and_output(
    records_dir: Path, workspace: Path
) -> None:
    write_setup(workspace, "echo ran >> marker\n")
    finished = HookRecord(
        operation_id="op",
        kind="setup",
        workspace=str(workspace),
        script=str(workspace / ".bb-env-setup.sh"),
        started_at=now_iso(),
        finished_at=now_iso(),
        outcome="succeeded",
        exit_code=0,
    )
    write_flat(records_dir, finished, b"set up before the upgrade\n")
    runner = HookRunner(records_dir, timeout_s=10)
    output = Output()
    try:
        outcome = await runner.run("op", "setup", workspace, output)
    finally:
        runner.close()

    assert outcome == HookOutcome("succeeded", 0, None)
    assert output.lines == ["set up before the upgrade"]
    assert executions(workspace) == 0
    assert [path.parent for path in files_in(records_dir)] == [records_dir, records_dir]


async def test_a_hook_an_earlier_release_runs_in_the_flat_layout_is_joined_there_and_then_deleted(
    records_dir: Path, workspace: Path
) -> None:
    # The earlier release's supervisor, still running: a process that writes only flat files.
    supervisor = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started_at = process_start_ticks(supervisor.pid)
        running = HookRecord(
            operation_id="op",
            kind="setup",
            workspace=str(workspace),
            script=str(workspace / ".bb-env-setup.sh"),
            started_at=now_iso(),
            supervisor_pid=supervisor.pid,
            supervisor_started_at=started_at,
        )
        write_flat(records_dir, running, b"halfway\n")
        runner = HookRunner(records_dir, timeout_s=10)
        output = Output()
        joined = asyncio.ensure_future(runner.run("op", "setup", workspace, output))
        await wait_until(lambda: output.lines == ["halfway"])

        with (records_dir / f"{digest('op')}.log").open("ab") as log:
            log.write(b"done\n")
        write_flat(records_dir, dataclasses.replace(running, finished_at=now_iso(), outcome="succeeded", exit_code=0))
        supervisor.kill()
        supervisor.wait()
        outcome = await joined
        forgotten = await runner.forget(["op"])
        runner.close()
    finally:
        supervisor.kill()
        supervisor.wait()

    assert outcome == HookOutcome("succeeded", 0, None)
    assert output.lines == ["halfway", "done"]
    assert forgotten == ["op"] and files_in(records_dir) == []


def test_settled_operations_are_found_in_both_layouts_and_an_emptied_shard_goes(records_dir: Path) -> None:
    records = HookRecords(records_dir)
    for operation_id in ("sharded", "also-sharded"):
        records.write(
            HookRecord(
                operation_id=operation_id,
                kind="setup",
                workspace="/w",
                script="/w/s",
                started_at=now_iso(),
                finished_at=now_iso(),
                outcome="succeeded",
            )
        )
    write_flat(
        records_dir,
        HookRecord(
            operation_id="flat",
            kind="teardown",
            workspace="/w",
            script="/w/t",
            started_at=now_iso(),
            finished_at=now_iso(),
            outcome="failed",
        ),
    )
    later = HookRecords(records_dir)  # a new process, which sees the flat layout
    cutoff = datetime.now(UTC) + timedelta(seconds=1)

    assert sorted(later.settled_before(cutoff)) == ["also-sharded", "flat", "sharded"]
    later.delete(["flat", "sharded"])

    assert [path.name for path in files_in(records_dir)] == [f"{digest('also-sharded')}.json"]
    assert sorted(path.name for path in records_dir.iterdir()) == [digest("also-sharded")[:2]]
