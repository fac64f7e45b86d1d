"""Faults around a real `bb serve`: its nats-server killed, its read model damaged, a second service
on its event store, its server.json deleted or damaged. Each ends with the service serving, or with
one clear line and nothing left running."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from bb_environments.bus.wire.api_messages import SpawnThread
from bb_environments.providers.host.processes import pid_alive
from tests.integration.conftest import Service, eventually, service_environment

SPAWNS = 4


def nats_servers_on(store_dir: Path) -> list[int]:
    """Pids of the nats-servers whose JetStream store is `store_dir`."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"nats-server") and str(store_dir).encode() in argv:
            pids.append(int(cmdline.parent.name))
    return pids


def zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" in status


def serve_log(service: Service) -> str:
    return (service.data_dir.parent / "serve.log").read_text()


def one_sentence(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bb: "), result.stderr
    return lines[0]


async def spawn_without_waiting(service: Service, repo: Path, thread_id: str) -> str:
    spawned = await service.api.call(
        "threads",
        "spawn",
        SpawnThread(thread_id=thread_id, environment_provider="git-worktree", project_path=str(repo)),
    )
    return spawned["environmentId"]


def slow_setup(repo: Path, marker: Path) -> None:
    """A setup hook that records its workspace and takes a while, so that spawns are in flight."""
    (repo / ".bb-env-setup.sh").write_text(f"pwd >> {marker}\nsleep 0.5\n")
    subprocess.run(["git", "-C", str(repo), "add", ".bb-env-setup.sh"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo), "commit", "-qm", "setup"], check=True
    )


async def test_a_killed_nats_server_is_restarted_reaped_and_spawns_in_flight_finish_once(service, git_repo, tmp_path):
    marker = tmp_path / "setups"
    slow_setup(git_repo, marker)
    environments = [await spawn_without_waiting(service, git_repo, f"t{n}") for n in range(SPAWNS)]
    killed = service.info["natsPid"]
    os.kill(killed, signal.SIGKILL)

    await eventually(lambda: service.refresh()["natsPid"] != killed, "a new natsPid in server.json")
    assert not zombie(killed)  # reaped before it was replaced
    assert service.info["natsUrl"].endswith(f":{service.info['natsPort']}")
    for environment_id in environments:
        await service.wait_for(environment_id, "ready")
    workspaces = marker.read_text().split()
    assert len(workspaces) == SPAWNS and len(set(workspaces)) == SPAWNS  # each setup ran once
    assert nats_servers_on(service.data_dir / "nats") == [service.info["natsPid"]]
    log = serve_log(service)
    assert log.count(f"nats-server (pid {killed}) died") == 1 and log.count("nats-server is back") == 1

    restarted = service.info["natsPid"]
    service.process.terminate()
    assert service.process.wait(timeout=30) == 0
    assert not pid_alive(restarted) and nats_servers_on(service.data_dir / "nats") == []


async def test_a_nats_server_that_keeps_failing_ends_serve_with_one_line_and_nothing_left(service):
    # It fails to start again: its configuration is not valid any more.
    (service.data_dir / "nats-server.conf").write_text("this is { not a nats configuration")
    os.kill(service.info["natsPid"], signal.SIGKILL)

    assert await asyncio.to_thread(service.process.wait, 60) == 1
    last = serve_log(service).strip().splitlines()[-1]
    assert last.startswith("bb: the embedded nats-server failed 5 times within a minute"), last
    assert nats_servers_on(service.data_dir / "nats") == []


async def test_a_killed_service_leaves_its_nats_server_to_the_next_one_even_without_server_json(service):
    nats_pid = service.info["natsPid"]
    service.kill()
    (service.data_dir / "server.json").unlink()
    await service.start()
    assert service.info["natsPid"] == nats_pid
    assert nats_servers_on(service.data_dir / "nats") == [nats_pid]


@pytest.mark.parametrize("damage", ["garbage header", "half truncated", "empty"])
async def test_a_damaged_read_model_is_set_aside_and_rebuilt_before_the_api_answers(service, git_repo, damage):
    environments = [await spawn_without_waiting(service, git_repo, f"t{n}") for n in range(2)]
    for environment_id in environments:
        await service.wait_for(environment_id, "ready")
    await service.stop()
    read_model = service.data_dir / "read-models.sqlite"
    content = read_model.read_bytes()
    assert len(content) > 8192
    read_model.write_bytes(
        {
            "garbage header": b"\x00garbage" * 16 + content[128:],
            "half truncated": content[: len(content) // 2],
            "empty": b"",
        }[damage]
    )

    await service.start()
    for environment_id in environments:  # at once: rebuilt before server.json named the service
        assert (await service.show(environment_id))["status"] == "ready"
    said = [line for line in serve_log(service).splitlines() if "rebuilt them from the log" in line]
    assert len(said) == 1, said
    set_aside = list(service.data_dir.glob("read-models.sqlite.corrupt-*"))
    if damage == "empty":
        assert "the read models were empty" in said[0] and not set_aside
    else:
        assert f"moved it to {set_aside[0].name}" in said[0] and len(set_aside) == 1
    assert (await service.bb("events", "replay")).returncode == 0


async def test_a_start_that_fails_exits_with_one_line_and_leaves_nothing_running(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "events.sqlite").write_bytes(b"not an event store" * 100)
    starting = Service(data_dir, service_environment(data_dir))

    result = await starting.bb("serve", timeout=60)
    assert result.returncode == 1
    assert "the event store" in one_sentence(result) and "cannot be opened" in result.stderr
    assert nats_servers_on(data_dir / "nats") == []


async def test_a_second_service_on_the_same_event_store_is_refused_naming_the_holder(service, tmp_path):
    store = service.data_dir / "events.sqlite"
    alias = tmp_path / "alias"
    alias.symlink_to(service.data_dir)
    for named in (store, alias / "events.sqlite"):
        other_dir = tmp_path / f"other-{named.parent.name}"
        other = Service(other_dir, service_environment(other_dir, BB_EVENT_STORE=f"sqlite:///{named}"))
        refused = await other.bb("serve", timeout=60)
        assert refused.returncode == 1
        said = one_sentence(refused)
        assert f"pid {service.process.pid}" in said and f"data dir {service.data_dir}" in said, said
        assert not (other_dir / "nats").exists()  # refused before it started anything


async def test_a_second_serve_on_the_data_dir_names_the_running_one_and_how_to_reach_it(service):
    refused = await service.bb("serve", timeout=60)
    assert refused.returncode == 1
    said = one_sentence(refused)
    assert f"pid {service.process.pid}" in said and service.info["natsUrl"] in said, said


async def test_server_json_deleted_or_changed_while_serving_is_written_again(service):
    server_file = service.data_dir / "server.json"
    written = server_file.read_text()
    for damage in (server_file.unlink, lambda: server_file.write_text("{}")):
        damage()
        await eventually(
            lambda: server_file.exists() and server_file.read_text() == written, "server.json written again", timeout=15
        )
        listed = await service.bb("environment", "list", "--json")
        assert listed.returncode == 0, listed.stderr


@pytest.mark.parametrize(
    "content",
    [b"{}", b"[]", b'{"natsUrl": 5}', b"\xff\xfe{", None],
    ids=["empty object", "array", "number url", "not utf-8", "a directory"],
)
async def test_a_damaged_server_json_is_unreachable_in_one_sentence(tmp_path, content):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    if content is None:
        (data_dir / "server.json").mkdir()
    else:
        (data_dir / "server.json").write_bytes(content)
    client = Service(data_dir, service_environment(data_dir))

    for args in (("environment", "list"), ("environment", "list", "--json")):
        result = await client.bb(*args)
        assert result.returncode == 4
        assert "unreachable" in one_sentence(result) and "server.json" in result.stderr
    assert json.loads(result.stdout)["error"]["code"] == "unreachable"


async def test_a_stale_server_json_naming_another_process_is_not_taken_for_the_service(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with socket.socket() as listener:  # a live process (this one) listening on the port it names
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        (data_dir / "server.json").write_text(
            json.dumps(
                {
                    "natsUrl": f"nats://127.0.0.1:{port}",
                    "pid": os.getpid(),
                    "hostId": "local",
                    "dataDir": str(data_dir),
                    "natsPid": os.getpid(),
                    "natsPort": port,
                }
            )
        )
        service = Service(data_dir, service_environment(data_dir))
        try:
            await service.start()
            assert service.info["natsPid"] != os.getpid() and service.info["natsPort"] != port
            assert nats_servers_on(data_dir / "nats") == [service.info["natsPid"]]
            listed = await service.bb("environment", "list", "--json")
            assert listed.returncode == 0, listed.stderr
        finally:
            await service.stop()


async def test_a_stop_asked_for_while_serve_starts_stops_everything_it_started(tmp_path):
    """SIGTERM as soon as its nats-server runs, before server.json names the service: what started
    is stopped, and the next start is a clean one."""
    data_dir = tmp_path / "data"
    starting = Service(data_dir, service_environment(data_dir))
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*Service.cli(), "serve"],
            env=starting.environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=output,
        )
    try:
        await eventually(
            lambda: nats_servers_on(data_dir / "nats") or process.poll() is not None,
            "the start of its nats-server",
            timeout=60,
        )
        assert not (data_dir / "server.json").exists(), "the start went too fast to be stopped midway"
        process.send_signal(signal.SIGTERM)
        await eventually(lambda: process.poll() is not None, "the end of bb serve", timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, log.read_text()
    await eventually(
        lambda: not [pid for pid in nats_servers_on(data_dir / "nats") if not zombie(pid)], "the end of its nats-server"
    )
    assert not (data_dir / "server.json").exists()
    await starting.start()
    await starting.stop()


async def test_a_damaged_seed_file_is_named_when_serve_refuses_to_start(service):
    await service.stop()
    seed = service.data_dir / "credentials" / "subscriber.nk"
    seed.write_bytes(b"")
    refused = await service.bb("serve", timeout=60)
    assert refused.returncode == 1
    said = one_sentence(refused)
    assert f"{seed} holds no valid seed; delete it and start `bb serve` again" in said, said
    assert not nats_servers_on(service.data_dir / "nats")
