"""The embedded server's address, read from server.json's URL without urllib (see _address)."""

from urllib.parse import urlsplit

import pytest

from bb_environments.bus.api_client.blocking_client import _address


def _urllib_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 4222


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:4222",
        "nats://127.0.0.1:61234/",
        "nats://LocalHost:1",
        "nats://h",
        "nats://h:",
        "nats://user:secret@h:7",
        "nats://[::1]:4222",
        "nats://[::1]",
        "nats://h:4222?q=@evil:9",
        "nats://h:4222#@evil:9",
        "nats://h:1?x",
        "nats://h?x",
        "nats://h:1/p?q#f",
    ],
)
def test_the_address_is_the_one_urllib_reads(url):
    assert _address(url) == _urllib_address(url)


@pytest.mark.parametrize("url", ["nats://h:99999", "nats://h:+1", "nats://h: 1", "nats://h:x", "nats://h:١٢"])
def test_a_port_that_is_not_one_is_refused_as_urllib_refuses_it(url):
    with pytest.raises(ValueError):
        _urllib_address(url)
    with pytest.raises(ValueError):
        _address(url)
