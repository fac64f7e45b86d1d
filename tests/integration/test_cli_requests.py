"""The commands that only send requests reach the embedded server over a socket of their own
(bus/blocking_client.py), not nats-py: what a user sees when the service, the seed or the server
are not what server.json promises is still one sentence and the SPEC's exit code, at once."""

from __future__ import annotations

import json
import os
import time

import nkeys

from tests.integration.conftest import Service, answer_lost_to_a_killed_service, service_environment


async def test_a_request_whose_service_died_before_answering_ends_at_once_naming_its_pid(service):
    result, waited = await answer_lost_to_a_killed_service(service, "bb.api.threads.archive", "thread", "archive",
                                                           "t1", "--json")

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
    server = {**service.info, "credentials": {**service.info["credentials"],
                                              "operator": service.info["credentials"]["subscriber"]}}
    (reader / "server.json").write_text(json.dumps(server))

    started = time.monotonic()
    result = await Service(reader, service_environment(reader)).bb("environment", "list", "--json")

    assert time.monotonic() - started < 30  # not the request's timeout of a minute
    assert result.returncode == 4, result.stderr
    assert "Permissions Violation for Publish" in result.json()["error"]["message"], result.stdout


async def test_a_service_that_is_gone_while_its_server_lives_is_nothing_that_answers(service):
    service.kill()

    result = await service.bb("environment", "show", "8f14e45f-ceea-4e7f-9f2b-6f1bc5e9a0c1", "--json")

    assert result.returncode == 4, result.stderr
    assert "nothing answers the API" in result.json()["error"]["message"], result.stdout
