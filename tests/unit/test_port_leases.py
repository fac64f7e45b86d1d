"""Choosing a lease on a host (domain/leases.py) and finding what listens there (providers/host/listening.py)."""

from __future__ import annotations

import asyncio
import socket
from uuid import uuid4

import pytest

from bb_environments.domain.leases import SLUG_PATTERN, HostLeases, NoFreePorts, PortBlock, PortRange, slug_base
from bb_environments.providers.host.listening import ListeningPorts, listening_ports


def test_a_block_skips_leased_blocks_and_listening_ports_and_a_full_range_names_both_and_the_settings():
    leases = HostLeases()
    ports = PortRange(100, 119, 5)
    leases.lease(uuid4(), "a-1", PortBlock(100, 5))
    assert leases.free_block("h1", ports, [107]) == PortBlock(108, 5)
    leases.lease(uuid4(), "b-2", PortBlock(108, 5))
    with pytest.raises(NoFreePorts) as refused:
        leases.free_block("h1", ports, [107, 115])
    assert str(refused.value).startswith(
        "host h1 has no 5 free consecutive ports left in BB_PORT_RANGE (100-119): "
        "leased to live environments: 100-104, 108-112; already listening: 107, 115."
    )
    assert "BB_PORTS_PER_ENVIRONMENT" in str(refused.value)


@pytest.mark.parametrize(
    "project, expected",
    [
        ("/src/My App", "my-app"),
        ("/src/2048-game", "game"),
        ("/src/___", "env"),
        (None, "personal-workspace"),
        ("/src/" + "x" * 80, "x" * 80),
    ],
)
def test_a_slug_is_readable_well_formed_and_unique_on_its_host(project, expected):
    assert slug_base(project, "personal-workspace") == expected
    leases = HostLeases()
    token = uuid4().hex
    first = leases.free_slug(slug_base(project, "personal-workspace"), token)
    leases.lease(uuid4(), first, None)
    second = leases.free_slug(slug_base(project, "personal-workspace"), token)  # the same token: made longer
    assert first != second and all(SLUG_PATTERN.match(slug) for slug in (first, second))


def test_the_probe_finds_a_port_something_listens_on():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert sock.getsockname()[1] in listening_ports()


async def test_plans_asking_together_share_one_read_of_the_socket_tables_and_a_later_one_reads_again():
    reads, clock = [], [100.0]

    def read() -> tuple[int, ...]:
        reads.append(clock[0])
        return (len(reads),)

    ports = ListeningPorts(read, fresh_s=0.5, clock=lambda: clock[0])
    assert await asyncio.gather(*(ports.now() for _ in range(50))) == [(1,)] * 50
    clock[0] += 0.4
    assert await ports.now() == (1,)
    clock[0] += 0.2  # past its freshness: a listener may have started since
    assert await ports.now() == (2,) and len(reads) == 2
