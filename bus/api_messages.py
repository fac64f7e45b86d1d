"""Request and reply bodies of the `bb-environments` NATS micro service (`bb.api.<area>.<verb>`)."""

from __future__ import annotations

from typing import Any

import msgspec

from bb_environments.domain.status import EnvironmentStatus


class Request(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    pass


class ListEnvironments(Request):
    status: EnvironmentStatus | None = None
    provider: str | None = None
    include_removed: bool = False
    """Removed environments are history: listed only when asked for (`--all`) or by `--status removed`."""


class EnvironmentRef(Request):
    environment_id: str
    min_position: int = 0


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


class ThreadRef(Request):
    thread_id: str


class Nothing(Request):
    pass


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
