"""The messages of the core's `Workspaces` port (handlers/ports.py): what the core asks of the host
where an environment's workspace lives, keyed by environment and attempt.

The host answers with the provider contract's own results (`Created`, `CreateFailed`, `Removed`,
`RemoveFailed`) and the pause and resume results here; all are msgspec structs, so an agent on
another machine can carry them as they are.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bb_environments.providers.contract import Previous


class PlanRequest(msgspec.Struct, frozen=True):
    """A path key to plan a workspace for, with the request's project and inputs as they came."""

    host_id: str
    provider_id: str
    project_path: str | None
    inputs: Any
    path_key: str


class Plan(msgspec.Struct, frozen=True):
    """A placement the host accepted: the project and the claimed path in canonical form, the
    inputs as the provider's type reads them (so nothing beside them is kept)."""

    project_path: str | None
    inputs: Any
    claimed_path: str | None
    shares_claimed_path: bool


class CreateRequest(msgspec.Struct, frozen=True):
    """One create attempt of an environment."""

    environment_id: str
    attempt: int
    host_id: str
    provider_id: str
    project_path: str | None
    inputs: Any
    thread_id: str
    path_key: str
    previous: Previous | None


class RemoveRequest(msgspec.Struct, frozen=True):
    """The removal of what create attempt `attempt` made (or left, when it failed)."""

    environment_id: str
    attempt: int
    host_id: str
    provider_id: str
    project_path: str | None
    inputs: Any
    path: str | None
    path_key: str
    resource: dict[str, Any] | None


class ResourceRequest(msgspec.Struct, frozen=True):
    """An environment's recorded resource, to pause or resume."""

    environment_id: str
    host_id: str
    provider_id: str
    resource: dict[str, Any]


class Paused(msgspec.Struct, frozen=True, tag="paused", tag_field="status"):
    resource: dict[str, Any]


class Resumed(msgspec.Struct, frozen=True, tag="resumed", tag_field="status"):
    resource: dict[str, Any]


class PauseFailed(msgspec.Struct, frozen=True, tag="failed", tag_field="status"):
    message: str


class ResumeFailed(msgspec.Struct, frozen=True, tag="failed", tag_field="status"):
    message: str


PauseResult = Paused | PauseFailed
ResumeResult = Resumed | ResumeFailed
