"""What each environment gets on its host, through a real `bb serve` (SPEC 11): a block of ports that
no live environment shares and nothing listened on, kept across a restart, and a slug."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Service, service, service_environment  # noqa: F401  (the fixture)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something listens on, with free ports around it (most likely)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def personal(service: Service, thread_id: str):
    return await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", thread_id, "--json"
    )


def block(environment: dict) -> range:
    return range(environment["ports"]["first"], environment["ports"]["first"] + environment["ports"]["count"])


async def test_blocks_avoid_listening_ports_are_kept_across_a_restart_and_a_full_range_is_refused(tmp_path, listener):
    port_range = f"{listener - 1}-{listener + 18}"  # one free port, the listener, then room for 3 blocks of 5
    service = Service(
        tmp_path / "data",
        service_environment(tmp_path / "data", BB_PORT_RANGE=port_range, BB_PORTS_PER_ENVIRONMENT="5"),
    )
    await service.start()
    try:
        for number in range(3):
            spawned = await personal(service, f"t{number}")
            assert spawned.returncode == 0, spawned.stderr
        refused = await personal(service, "t3")

        assert refused.returncode == 1, refused.stderr
        message = refused.json()["error"]["message"]
        assert "BB_PORT_RANGE" in message and port_range in message and "BB_PORTS_PER_ENVIRONMENT" in message
        assert f"{listener + 1}-{listener + 5}" in message  # a leased block, named
        listed = (await service.bb("environment", "list", "--json")).json()["environments"]
        blocks = sorted((block(e) for e in listed), key=lambda b: b.start)
        assert [(b.start, b.stop) for b in blocks] == [
            (listener + 1, listener + 6),
            (listener + 6, listener + 11),
            (listener + 11, listener + 16),
        ]
        assert all(listener not in b for b in blocks)
        slugs = [e["slug"] for e in listed]
        assert len(set(slugs)) == 3 and all(re.fullmatch(r"[a-z][a-z0-9-]{0,39}", s) for s in slugs)
        shown = await service.bb("environment", "show", listed[0]["id"])
        assert f"{listed[0]['ports']['first']}-{listed[0]['ports']['first'] + 4}" in shown.stdout
        assert listed[0]["slug"] in shown.stdout

        await service.stop()
        await service.start()
        after = (await service.bb("environment", "list", "--json")).json()["environments"]
        assert {e["id"]: (e["ports"], e["slug"]) for e in after} == {e["id"]: (e["ports"], e["slug"]) for e in listed}
        still_refused = await personal(service, "t3")
        assert still_refused.returncode == 1, still_refused.stderr

        archived = await service.bb("thread", "archive", "t0", "--wait", "--json")
        assert archived.returncode == 0, archived.stderr
        again = await personal(service, "t3")
        assert again.returncode == 0, again.stderr
        freed = next(e for e in listed if "t0" in e["threadIds"])
        assert (await service.show(again.json()["environmentId"]))["ports"] == freed["ports"]
    finally:
        await service.stop()
