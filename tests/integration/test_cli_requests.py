"""The commands that only send requests reach the embedded server over a socket of their own
(bus/api_client/blocking_client.py), not nats-py: what a user sees when the service, the seed or the server
are not what server.json promises is still one sentence and the SPEC's exit code, at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import nkeys

from tests.integration.conftest import Service, answer_lost_to_a_killed_service, service_environment


async def test_a_request_whose_service_died_before_answering_ends_at_once_naming_its_pid(service):
    result, waited = await answer_lost_to_a_killed_service(
        service, "bb.api.threads.archive", "thread", "archive", "t1", "--json"
    )

    assert waited < 10  # not the request's timeout of a minute
    assert result.returncode == 4, result.stderr
    said = result.json()["error"]["message"]
    assert f"pid {service.info['pid']}" in said and "ended before it answered threads archive" in said, said
    assert "may have taken effect" in said  # an archive changes something: it may have been recorded


async def test_a_seed_the_server_does_not_know_is_refused_in_one_sentence(service, tmp_path):
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    # A seed of the right kind (a user NKEY) that no account of this server lists.
    (stranger / "operator.nk").write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
    server = {**service.info, "credentials": {**service.info["credentials"], "operator": str(stranger / "operator.nk")}}
    (stranger / "server.json").write_text(json.dumps(server))

    result = await Service(stranger, service_environment(stranger)).bb("environment", "list", "--json")

    assert result.returncode == 4, result.stderr
    said = result.json()["error"]["message"]
    assert "refused the connection" in said and "Authorization Violation" in said, said


async def test_a_seed_without_the_operators_permissions_is_refused_at_once(service, tmp_path):
    reader = tmp_path / "reader"
    reader.mkdir()
    server = {
        **service.info,
        "credentials": {**service.info["credentials"], "operator": service.info["credentials"]["subscriber"]},
    }
    (reader / "server.json").write_text(json.dumps(server))

    started = time.monotonic()
    # A subscriber may read (list, show); deleting is the operator's alone.
    result = await Service(reader, service_environment(reader)).bb(
        "environment", "delete", "8f14e45f-ceea-4e7f-9f2b-6f1bc5e9a0c1", "--json"
    )

    assert time.monotonic() - started < 30  # not the request's timeout of a minute
    assert result.returncode == 4, result.stderr
    assert "Permissions Violation for Publish" in result.json()["error"]["message"], result.stdout


async def test_a_service_that_is_gone_while_its_server_lives_is_nothing_that_answers(service):
    service.kill()

    result = await service.bb("environment", "show", "8f14e45f-ceea-4e7f-9f2b-6f1bc5e9a0c1", "--json")

    assert result.returncode == 4, result.stderr
    assert "nothing answers the API" in result.json()["error"]["message"], result.stdout


async def test_an_impostor_on_the_servers_port_cannot_make_the_cli_buffer_a_huge_answer(tmp_path):
    """Whatever listens where server.json points (the embedded server died and something else took
    its port) may promise any size of answer: the CLI ends at the promise, not after reading it."""
    promised = 1024 * 1024 * 1024  # far above the 64 MiB the CLI would ever hold for one answer
    sent = 0

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        writer.write(b'INFO {"server_id":"x","max_payload":2147483647,"headers":true,"nonce":"abc"}\r\n')
        while not (line := await reader.readline()).startswith(b"PUB "):
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
            if not line:
                return
        inbox = line.split()[2]
        writer.write(b"MSG " + inbox + b" 1 " + str(promised).encode() + b"\r\n")
        try:
            while sent < promised:
                writer.write(b"x" * 65536)
                await writer.drain()
                sent += 65536
        except ConnectionError:
            pass  # the CLI hung up: what this test wants
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    seed = data_dir / "operator.nk"
    seed.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
    (data_dir / "server.json").write_text(
        json.dumps(
            {
                "natsUrl": f"nats://127.0.0.1:{port}",
                "pid": os.getpid(),
                "hostId": "local",
                "dataDir": str(data_dir),
                "credentials": {"operator": str(seed), "publisher": str(seed), "subscriber": str(seed)},
            }
        )
    )
    try:
        result = await Service(data_dir, service_environment(data_dir)).bb("environment", "list", "--json")
    finally:
        server.close()

    assert result.returncode == 4, result.stderr
    assert "dropped before it answered environments list" in result.json()["error"]["message"], result.stdout
    assert sent < 64 * 1024 * 1024, sent


async def test_a_reader_that_leaves_ends_the_command_quietly(service):
    """`bb events export | head -1`: the reader closing the pipe is no lost connection to the
    service; the command ends at once with exit 1 and says nothing."""
    spawned = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1")
    assert spawned.returncode == 0, spawned.stderr
    for args in (("events", "export"), ("environment", "list"), ("thread", "list", "--json")):
        gone_reader, writer = os.pipe()
        os.close(gone_reader)  # every write to the pipe now fails with EPIPE
        try:
            process = await asyncio.create_subprocess_exec(
                *service.cli(), *args, env=service.environment, stdout=writer, stderr=asyncio.subprocess.PIPE
            )
        finally:
            os.close(writer)
        _, said = await asyncio.wait_for(process.communicate(), 60)
        assert (process.returncode, said.decode()) == (1, ""), args


async def test_a_tail_whose_reader_left_ends_at_the_next_event_quietly(service):
    """`bb events tail | head -1`: the first event the tail cannot write ends it (exit 1, nothing
    said), rather than a tail that runs on unseen or dies with a traceback."""
    for as_json in ((), ("--json",)):
        gone_reader, writer = os.pipe()
        os.close(gone_reader)
        try:
            process = await asyncio.create_subprocess_exec(
                *service.cli(),
                "events",
                "tail",
                *as_json,
                env=service.environment,
                stdout=writer,
                stderr=asyncio.subprocess.PIPE,
            )
        finally:
            os.close(writer)
        # Spawn until the tail, subscribed at some point, has an event to write.
        deadline = time.monotonic() + 60
        while process.returncode is None and time.monotonic() < deadline:
            spawned = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace")
            assert spawned.returncode == 0, spawned.stderr
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), 1)
        if process.returncode is None:
            process.kill()
        _, said = await process.communicate()
        assert (process.returncode, said.decode()) == (1, ""), as_json


async def test_events_export_reads_the_event_store_itself_once_the_service_is_stopped(service, tmp_path):
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1", "--json"
    )
    assert spawned.returncode == 0, spawned.stderr
    await service.wait_for(spawned.json()["environmentId"], "ready")
    await service.measured()  # its last event written, so that the service adds none before it stops
    while_serving = await service.bb("events", "export")
    assert while_serving.returncode == 0, while_serving.stderr
    await service.stop()

    stopped = await service.bb("events", "export")

    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == while_serving.stdout  # the same documents, byte for byte, in log order
    assert [json.loads(line)["type"] for line in stopped.stdout.splitlines()][:1] == ["claimed"]


async def test_events_export_of_a_data_dir_nothing_was_served_from_is_not_found_and_creates_nothing(tmp_path):
    data_dir = tmp_path / "never-served"

    exported = await Service(data_dir, service_environment(data_dir)).bb("events", "export", "--json")

    assert exported.returncode == 3, exported.stderr
    assert "there is no event store at" in exported.json()["error"]["message"]
    assert not data_dir.exists()
