"""The embedded nats-server's address stays put (SPEC section 8.1): its port is chosen once and
remembered in the data dir, so that a client connected as README shows rides a restart of
`bb serve` out by itself; `--nats-port` / BB_NATS_PORT set it, and a port that cannot be had is
refused, never swapped for another."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.aio.client
import pytest

from bb_environments.bus.embedded_server import FIRST_PORTS, free_port
from bb_environments.providers.host.processes import pid_alive
from tests.integration.conftest import Result, Service, eventually, service_environment
from tests.integration.test_faults import nats_servers_on


def remembered(data_dir: Path) -> int:
    return int((data_dir / "nats-port").read_text())


@contextlib.asynccontextmanager
async def client_as_readme_shows(service: Service) -> AsyncIterator[tuple[nats.aio.client.Client, list[str]]]:
    """A connection with server.json's URL and the publisher's seed, nats-py's reconnect options
    left as they are, and the subjects it has heard under `bb.environments.>`."""
    heard: list[str] = []

    async def hear(message: nats.aio.client.Msg) -> None:
        heard.append(message.subject)

    info = json.loads((service.data_dir / "server.json").read_text())
    nc = await nats.connect(info["natsUrl"], nkeys_seed=info["credentials"]["publisher"])
    try:
        await nc.subscribe("bb.environments.>", cb=hear)
        await nc.flush()
        yield nc, heard
    finally:
        await nc.close()


async def back(nc: nats.aio.client.Client, reconnects: int) -> None:
    """Until the client has reconnected by itself, `reconnects` times in all (nats-py tries every
    2 s): what is published while it is away never reaches a plain subscription, whatever the port."""
    await eventually(
        lambda: nc.is_connected and nc.stats["reconnects"] == reconnects, f"reconnect number {reconnects} of the client"
    )
    await nc.flush()  # the subscriptions it sent again are the server's


async def spawn_heard(service: Service, heard: list[str]) -> None:
    """Spawn an environment and wait for the client to hear it get ready."""
    spawned = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--json")
    assert spawned.returncode == 0, spawned.stderr
    ready = f"bb.environments.{spawned.json()['environmentId']}.ready"
    await eventually(lambda: ready in heard, f"{ready} reaching the client", timeout=60)


@contextlib.contextmanager
def listening_elsewhere(port: int | None = None) -> Iterator[int]:
    """Another process's listener (this one's) on `port`, or on a free one."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port or 0))
        listener.listen()
        yield listener.getsockname()[1]


def one_line_refusal(result: Result) -> str:
    """The one line on stderr, and nothing else there."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bb: "), result.stderr
    return lines[0]


async def test_a_client_connected_before_a_restart_hears_the_service_after_it_on_the_same_port(service):
    port = service.info["natsPort"]
    assert remembered(service.data_dir) == port
    async with client_as_readme_shows(service) as (nc, heard):
        await spawn_heard(service, heard)

        await service.stop()  # SIGTERM: the service stops its nats-server with it
        await service.start()
        assert service.info["natsPort"] == port and service.info["natsUrl"] == f"nats://127.0.0.1:{port}"
        await back(nc, reconnects=1)  # it was cut off, and came back by itself
        await spawn_heard(service, heard)

        killed = service.info["natsPid"]  # a server that dies is started again where it was
        os.kill(killed, signal.SIGKILL)
        await eventually(lambda: service.refresh()["natsPid"] != killed, "a restarted nats-server in server.json")
        assert service.info["natsPort"] == port
        await back(nc, reconnects=2)
        await spawn_heard(service, heard)


async def test_the_port_stays_after_a_sigkill_of_the_service_and_after_one_of_its_nats_server_too(service):
    port, left_running = service.info["natsPort"], service.info["natsPid"]
    async with client_as_readme_shows(service) as (nc, heard):
        service.kill()  # its nats-server lives on, for the next start to reuse
        await service.start()
        assert (service.info["natsPort"], service.info["natsPid"]) == (port, left_running)
        await spawn_heard(service, heard)
        assert nc.stats["reconnects"] == 0  # never cut off

        service.kill()  # and both, as a machine that went down leaves the data dir
        os.kill(left_running, signal.SIGKILL)
        await eventually(lambda: not pid_alive(left_running), "the nats-server's end", timeout=10)
        await service.start()
        assert service.info["natsPort"] == port and service.info["natsPid"] != left_running
        await back(nc, reconnects=1)
        await spawn_heard(service, heard)


async def test_the_first_port_is_one_no_outgoing_connection_can_take_before_the_next_start(service):
    """Outgoing connections take ports of the kernel's ephemeral range at random: a remembered port
    there could be taken by one when the server starts again (after a reboot, say)."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    port = remembered(service.data_dir)
    assert port in FIRST_PORTS and not low <= port <= high


async def test_a_data_dir_of_an_earlier_release_gets_a_port_at_its_next_start_and_keeps_it(service):
    await service.stop()
    (service.data_dir / "nats-port").unlink()  # as a release that did not remember it left the data dir

    await service.start()
    port = service.info["natsPort"]
    assert remembered(service.data_dir) == port
    await service.stop()
    await service.start()
    assert service.info["natsPort"] == port


async def test_the_flag_beats_the_variable_beats_the_remembered_port_and_sets_it_from_now_on(tmp_path):
    data_dir = tmp_path / "data"
    from_variable, from_flag = free_port(), free_port()
    service = Service(data_dir, service_environment(data_dir, BB_NATS_PORT=str(from_variable)))
    try:
        await service.start()
        assert service.info["natsPort"] == remembered(data_dir) == from_variable
        await service.stop()

        await service.start("--nats-port", str(from_flag))
        assert service.info["natsPort"] == remembered(data_dir) == from_flag
        await service.stop()

        del service.environment["BB_NATS_PORT"]
        await service.start()
        assert service.info["natsPort"] == from_flag
        listed = await service.bb("environment", "list", "--json")
        assert listed.returncode == 0, listed.stderr
    finally:
        await service.stop()


async def test_a_server_left_running_on_another_port_than_the_one_asked_for_moves_to_it(service):
    left_running = service.info["natsPid"]
    service.kill()
    asked = free_port()

    await service.start("--nats-port", str(asked))
    assert service.info["natsPort"] == remembered(service.data_dir) == asked
    assert nats_servers_on(service.data_dir / "nats") == [service.info["natsPid"]] != [left_running]
    listed = await service.bb("environment", "list", "--json")
    assert listed.returncode == 0, listed.stderr


@pytest.mark.parametrize("setting", ["flag", "variable"])
@pytest.mark.parametrize("value", ["0", "65536", "-1", "4222x", "nats"])
async def test_a_port_that_is_not_one_is_refused_with_exit_2_and_nothing_written(tmp_path, setting, value):
    data_dir = tmp_path / "data"
    if setting == "flag":
        service = Service(data_dir, service_environment(data_dir))
        result = await service.bb("serve", "--nats-port", value, "--json")
        assert result.json()["error"]["code"] == "invalid_input"
        named = f"--nats-port {value!r}"
    else:
        service = Service(data_dir, service_environment(data_dir, BB_NATS_PORT=value))
        result = await service.bb("serve")
        named = f"BB_NATS_PORT {value!r}"

    assert result.returncode == 2
    assert one_line_refusal(result) == f"bb: {named} is not allowed: use a port number from 1 to 65535"
    assert not data_dir.exists()


async def test_a_port_taken_by_another_process_is_refused_in_one_line_not_moved(service):
    port = service.info["natsPort"]
    await service.stop()

    with listening_elsewhere(port):  # taken while the service was stopped
        refused = await service.bb("serve")
    assert refused.returncode == 1
    assert one_line_refusal(refused) == (
        f"bb: port {port} on 127.0.0.1 is taken by another process: free it, "
        "or give the embedded nats-server another with `bb serve --nats-port PORT`"
    )
    assert remembered(service.data_dir) == port

    with listening_elsewhere() as taken:
        refused = await service.bb("serve", "--nats-port", str(taken))
    assert refused.returncode == 1 and f"port {taken} on 127.0.0.1 is taken" in one_line_refusal(refused)
    assert remembered(service.data_dir) == port
    assert nats_servers_on(service.data_dir / "nats") == []

    await service.start()  # and once the port is free again, served on it
    assert service.info["natsPort"] == port


async def test_a_remembered_port_that_is_not_one_is_refused_naming_its_file(service):
    await service.stop()
    port_file = service.data_dir / "nats-port"
    port_file.write_text("48 000\n")

    refused = await service.bb("serve")
    assert refused.returncode == 1
    assert one_line_refusal(refused) == (
        f"bb: {port_file} says '48 000', which is not a port: correct it, remove it "
        "(a free port is then chosen), or start `bb serve` with --nats-port"
    )
    assert nats_servers_on(service.data_dir / "nats") == []


async def test_a_port_with_an_external_nats_is_refused_with_exit_2(tmp_path):
    data_dir = tmp_path / "data"
    service = Service(data_dir, service_environment(data_dir, BB_NATS_PORT="4222"))
    result = await service.bb("serve", "--nats-url", f"nats://127.0.0.1:{free_port()}", "--json")
    assert result.returncode == 2 and result.json()["error"]["code"] == "invalid_input"
    assert one_line_refusal(result) == (
        "bb: --nats-port (BB_NATS_PORT) is the embedded nats-server's port: with --nats-url (BB_NATS_URL) there is none"
    )
    assert not data_dir.exists()
