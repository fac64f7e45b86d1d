"""One rule for host ids (SPEC 7.1): what `BB_HOST_ID` accepts is what a spawn on that host accepts."""

from collections.abc import Callable

import pytest

from bb_environments.bus.access import check_host_id
from bb_environments.domain.request_errors import InvalidInput
from bb_environments.entrypoints.cli.support import Failure, host_id_argument
from bb_environments.entrypoints.config import ConfigError, Settings
from bb_environments.handlers import placement


def test_a_host_id_that_does_not_start_with_a_letter_or_digit_is_refused_at_start(monkeypatch):
    monkeypatch.setenv("BB_HOST_ID", "-a")
    with pytest.raises(ConfigError, match=r"^BB_HOST_ID: host id '-a' is not allowed: use 1-64 letters"):
        Settings.load("/tmp/bb-host-id-test")


@pytest.mark.parametrize(
    "check, refusal",
    [(check_host_id, ValueError), (host_id_argument, Failure), (placement.check_host_id, InvalidInput)],
    ids=["bus access and config", "cli --host", "placement"],
)
def test_every_checker_draws_the_line_at_64_characters(check: Callable[[str], str], refusal: type[Exception]):
    assert check("h" * 64) == "h" * 64
    assert check("a-_9") == "a-_9"
    for refused in ("h" * 65, "h" * 100, "-a", "_a", "a\n", "a.b", ""):
        with pytest.raises(
            refusal, match="is not allowed: use 1-64 letters, digits, '-' or '_', starting with a letter or digit"
        ):
            check(refused)
