"""A full disk while a setup hook finishes, against a real `bb serve`.

The service's stores (hook records, event store, read model) live on a small tmpfs that the test
fills up, so that their writes fail with a real ENOSPC, and frees again. The embedded nats-server
keeps its store elsewhere: what JetStream does on a full disk is the server's business.

Whatever the disk refuses meanwhile, the hook's outcome is held (by its supervisor, by the step
that records it) until it can be written: the environment becomes ready once space returns, the
setup ran once, nothing is "interrupted", and the log says so in a few lines, not a traceback per
attempt.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Service, eventually, spawn_with_setup_held
from tests.support.small_disk import SmallDisk, small_disk

# Long enough for a retry loop without backoff to fill the log (the issue saw 8 tracebacks a second).
FULL_FOR_S = 3.0
DEADLINE_S = 30.0
STORED_ON_DISK = ("hooks", "events.sqlite", "read-models.sqlite")


@pytest.fixture(autouse=True)
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """The small disk, with the service's stores linked onto it before the `service` fixture starts it.

    Autouse fixtures are set up before the others of their scope, and torn down after them.
    """
    with small_disk(tmp_path / "disk") as disk:
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        (disk.path / "hooks").mkdir()
        for name in STORED_ON_DISK:
            (data_dir / name).symlink_to(disk.path / name)
        yield disk


def serve_log(service: Service) -> list[str]:
    return (service.data_dir.parent / "serve.log").read_text().splitlines()


def logged(service: Service, text: str) -> int:
    return sum(text in line for line in serve_log(service))


def hook_records(service: Service) -> list[dict]:
    return [json.loads(path.read_text()) for path in (service.data_dir / "hooks").rglob("*.json")]


async def setup_finished_on_a_full_disk(service: Service, disk: SmallDisk, git_repo: Path, tmp_path: Path) -> str:
    """An environment whose setup hook finished after the disk filled up, its outcome refused."""
    hold = tmp_path / "hold-setup"
    # The script's last command must not write to its log on the full disk: that would fail it.
    environment_id = await spawn_with_setup_held(service, git_repo, hold, tmp_path / "hooks.log")

    disk.fill()
    hold.unlink()
    await eventually(
        lambda: logged(service, f"recording the setup outcome of environment {environment_id} failed"),
        "a refused save of the setup outcome",
    )
    [record] = hook_records(service)
    assert record["finished_at"] is None  # the supervisor could not write it either
    assert (await service.show(environment_id))["status"] == "provisioning"
    return environment_id


async def assert_ready_once(service: Service, environment_id: str, tmp_path: Path) -> None:
    ready = await service.wait_for(environment_id, "ready", timeout=DEADLINE_S)
    assert ready["hooks"]["setup"]["status"] == "succeeded"
    assert (tmp_path / "hooks.log").read_text().split() == ["setup"]
    # The supervisor wrote its record once there was room again.
    await eventually(lambda: hook_records(service)[0]["finished_at"] is not None, "the hook record's outcome")
    assert hook_records(service)[0]["outcome"] == "succeeded"
    exported = await service.bb("events", "export")
    types = [json.loads(line)["type"] for line in exported.stdout.splitlines()]
    assert types.count("setup_succeeded") == 1 and types.count("ready") == 1
    assert "setup_failed" not in types


def assert_no_flood(service: Service, processes: int) -> None:
    """A few lines for the whole episode: each retrying party (the supervisor logs nothing) says
    once per service process that its writes are refused, and once that they went through."""
    log = serve_log(service)
    assert len(log) < 20, "\n".join(log)
    assert not [line for line in log if "Traceback" in line or "never retrieved" in line], "\n".join(log)
    assert not [line for line in log if "interrupted" in line], "\n".join(log)
    refused = Counter(_party(line, " failed (") for line in log if "retrying with backoff" in line)
    recovered = Counter(_party(line, " succeeded after ") for line in log if " succeeded after " in line)
    assert refused and max(refused.values()) <= processes, refused
    assert set(recovered) == set(refused) and max(recovered.values()) == 1, recovered


def _party(line: str, verb: str) -> str:
    """The logger and party of a line such as `<time> WARNING <logger>: <party> failed (...)`."""
    return line.split(" ", 3)[3].split(verb)[0]


async def test_an_outcome_refused_by_a_full_disk_makes_the_environment_ready_once_space_returns(
    service: Service, disk: SmallDisk, git_repo: Path, tmp_path: Path
) -> None:
    environment_id = await setup_finished_on_a_full_disk(service, disk, git_repo, tmp_path)
    await asyncio.sleep(FULL_FOR_S)  # the disk stays full a while: time for retries to pile up in the log

    disk.free()

    await assert_ready_once(service, environment_id, tmp_path)
    assert_no_flood(service, processes=1)


async def test_a_restart_while_the_outcome_waits_for_space_still_ends_ready_once(
    service: Service, disk: SmallDisk, git_repo: Path, tmp_path: Path
) -> None:
    environment_id = await setup_finished_on_a_full_disk(service, disk, git_repo, tmp_path)

    service.kill()
    await service.start()
    # The restarted service gets the outcome from the hook's supervisor, and cannot save it either.
    await eventually(
        lambda: logged(service, f"recording the setup outcome of environment {environment_id} failed") == 2,
        "the restarted service's refused save",
    )
    disk.free()

    await assert_ready_once(service, environment_id, tmp_path)
    assert_no_flood(service, processes=2)
