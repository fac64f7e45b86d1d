"""Request and reply bodies of the `bb-environments` NATS micro service (`bb.api.<area>.<verb>`).

The listings' replies, which carry the read side's views, are declared with their endpoints
(bus/core/api_endpoints.py): this module is what a client needs, and `bb` imports it without the domain."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

import msgspec

from bb_environments.bus.wire.service_errors import ServiceError, unreachable
from bb_environments.domain.status import EnvironmentStatus

ERROR_CODE_HEADER = "Nats-Service-Error-Code"
"""The header a NATS micro service's error reply carries (its body is an ErrorReply): nats.micro's
constant, which `bb` cannot import without loading all of nats-py."""

LONG_WORK = frozenset({("events", "replay"), ("doctor", "run")})
"""The requests (area, verb) whose work may take longer than an attempt (bus/wire/resending.py):
sent once and waited for, since each attempt more would start the whole work again."""

DEFAULT_PAGE = 200
MAX_PAGE = 1000
"""The most items a listing page holds; fewer come when more would not fit in one NATS message."""

PageLimit = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=MAX_PAGE,
        description=(
            "At most this many items (1 to 1000, default 200); a page also ends before it would exceed the NATS "
            "maximum payload."
        ),
    ),
]
Cursor = Annotated[
    str | None,
    msgspec.Meta(
        description=("The `next` of the page before: this page starts after that item (absent or null: at the first).")
    ),
]
Next = Annotated[
    str | None, msgspec.Meta(description=("Null on the last page; otherwise send it as `after` for the next page."))
]

At = Annotated[
    Annotated[int, msgspec.Meta(ge=1)] | Annotated[datetime, msgspec.Meta(tz=True)] | None,
    msgspec.Meta(
        description=(
            "A version (1 or more), or an ISO-8601 instant with its timezone (the last version recorded then or "
            "before): the document as it was then, folded from the event store. Absent or null: the document now."
        )
    ),
]


class Request(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    pass


class ListEnvironments(Request):
    status: EnvironmentStatus | None = None
    provider: str | None = None
    include_removed: bool = False
    """Removed environments are history: listed only when asked for (`--all`) or by `--status removed`."""
    after: Cursor = None
    limit: PageLimit = DEFAULT_PAGE


class EnvironmentRef(Request):
    environment_id: str
    min_position: int = 0


class EnvironmentAt(EnvironmentRef):
    """`environments.show`: the environment's document now, or as it was at `at`."""

    at: At = None


class ListHistory(Request):
    """`environments.history`: a page of the environment's events, in log order."""

    environment_id: str
    after: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            description=(
                "The `next` of the page before: this page starts after that version (absent or 0: at the first)."
            ),
        ),
    ] = 0
    limit: PageLimit = DEFAULT_PAGE


class SpawnThread(Request):
    thread_id: str | None = None
    environment_provider: str | None = None
    environment_inputs: Any = None
    environment_id: str | None = None
    project_path: str | None = None
    host_id: str | None = None
    parent_thread_id: str | None = None
    prompt: str | None = None


class ListThreads(Request):
    environment_id: str | None = None
    after: Cursor = None
    limit: PageLimit = DEFAULT_PAGE


class ThreadRef(Request):
    thread_id: str


class Nothing(Request):
    pass


class Examine(Request):
    """`doctor.run`: compare the log with what exists on every host."""

    fix: bool = False
    """Also remove the orphans (their work saved first) and record each missing workspace."""


class Spawned(msgspec.Struct, rename="camel"):
    thread_id: str
    environment_id: str | None
    status: str
    position: int
    refusal: str | None = None


class Accepted(msgspec.Struct, rename="camel"):
    environment_id: str | None
    status: str | None
    position: int


class ErrorBody(msgspec.Struct):
    code: str
    message: str


class ErrorReply(msgspec.Struct):
    error: ErrorBody


def decode_answer(headers: Mapping[str, str], data: bytes) -> dict[str, Any]:
    """An API reply, whichever client it reached: the answer, the service's refusal raised as
    ServiceError, or a reply that is not the API's raised as a failed connection."""
    try:
        if ERROR_CODE_HEADER in headers:
            refusal = msgspec.json.decode(data, type=ErrorReply).error
            raise ServiceError(refusal.code, refusal.message)
        answer = msgspec.json.decode(data)
    except msgspec.DecodeError as damaged:
        raise unreachable(f"the connection to it failed: an answer that is not the API's ({damaged})") from None
    if not isinstance(answer, dict):
        raise unreachable("the connection to it failed: an answer that is not the API's (not an object)")
    return answer


class HookOutputAt(Request):
    """`environments.output`: a page of one of the environment's hook operations' output, as its
    host's records keep it (the transcript keeps the last 2000 lines of an environment)."""

    environment_id: str
    operation_id: str
    offset: int = 0


class RegisterHost(Request):
    """`machines.register`: a host's agent may connect with the seed this makes."""

    host_id: str
    rotate: bool = False
    """Replace the credentials of a host registered already (its agent is disconnected)."""


class HostRef(Request):
    host_id: str


class SetPool(Request):
    """`pools.set`: keep `size` ready members for the key (SPEC 10); 0 drains the pool."""

    project_path: str | None
    provider_id: str
    size: int
    host_id: str | None = None
    """None: the host a spawn that names none goes to."""
    inputs: Any = None


class PoolRef(Request):
    pool_id: str


class SetSecret(Request):
    """`secrets.set`: give the project's hooks the secret `name` (operator only; see docs/security.md)."""

    project_path: str
    name: str
    value: str


class SecretRef(Request):
    project_path: str
    name: str


class ProjectRef(Request):
    project_path: str
