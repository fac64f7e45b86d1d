"""What a call to the bb service can end in, as the caller sees it.

Apart from bus/api_client/nats_client.py, which imports nats-py: `bb` names these before it connects, and imports
nats-py only once it knows the URL (entrypoints/cli/connection.py, `open_client`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

SERVICE_CHECK_S = 0.5
"""How often a request waiting for its answer looks whether the service's process still runs."""


class ServiceError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def unreachable(detail: str, data_dir: str | Path | None = None, hint: str | None = None) -> ServiceError:
    where = f" for data dir {data_dir}" if data_dir else ""
    return ServiceError(
        "unreachable", f"the bb service{where} is unreachable ({detail}); {hint or 'start it with `bb serve`'}"
    )


REFUSED_HINT = "ask with the credentials of a role that may (docs/security.md, Roles)"


def refused_request(detail: str) -> ServiceError:
    """The NATS server would not pass the request on: the role of these credentials may not ask it."""
    return unreachable(detail, hint=REFUSED_HINT)


class AnswerLost(ServiceError):
    """The request may have reached the service, but its answer cannot come: whether it was done is
    not known (a spawn, say, may have been recorded)."""

    def __init__(self, message: str) -> None:
        super().__init__("unreachable", message)
