"""The messages of the core's `Host` port (handlers/ports.py): what the core asks of the host
where an environment's workspace lives, keyed by environment and attempt.

The host answers with the provider contract's own results (`Created`, `CreateFailed`, `Removed`,
`RemoveFailed`) and the pause and resume results here; all are msgspec structs, so an agent on
another machine can carry them as they are.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bb_environments.providers.contract import BaseHead, Leftover, Previous


class PlanRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """A path key to plan a workspace for, with the request's project and inputs as they came."""

    host_id: str
    provider_id: str
    project_path: str | None
    inputs: Any
    path_key: str
    project_roots: tuple[str, ...] | None = None
    """The canonical directories the project must lie in (None: anywhere), checked before anything
    runs in it; left out on the wire when None, as an agent of an earlier release sent it."""
    base_head: bool = False
    """Also read where a pool's member would be prepared now (Plan.base_head), if the provider pools."""
    member: bool = False
    """Plan a pool's member under `path_key`: the inputs planned are the provider's member inputs."""


class Plan(msgspec.Struct, frozen=True):
    """A placement the host accepted: the project and the claimed path in canonical form, the
    inputs as the provider's type reads them (so nothing beside them is kept)."""

    project_path: str | None
    inputs: Any
    claimed_path: str | None
    shares_claimed_path: bool
    listening: tuple[int, ...] = ()
    """The TCP ports something listens on on the host now (providers/host/listening.py), which no
    environment's block may hold; an agent of an earlier release leaves it out (none found)."""
    base_head: BaseHead | None = None
    """Asked for (PlanRequest.base_head) and the provider pools: where a member would be prepared now."""


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


class BindRequest(msgspec.Struct, frozen=True):
    """A pool's member bound to a thread: give its workspace the thread's identity (its branch)."""

    environment_id: str
    host_id: str
    provider_id: str
    project_path: str | None
    inputs: Any
    """The thread's inputs."""
    path_key: str
    """The thread's path key."""
    path: str
    resource: dict[str, Any] | None


class Bound(msgspec.Struct, frozen=True, tag="bound", tag_field="status"):
    resource: dict[str, Any] | None


class NotBound(msgspec.Struct, frozen=True, tag="failed", tag_field="status"):
    message: str


BindResult = Bound | NotBound


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
    removal_attempt: int = 0
    """The environment's removal attempt this is; 0 for the cleanup of a failed create attempt."""
    unbound_member: bool = False
    """A warm pool's member no thread ever took: nothing in it is anyone's work (RemoveContext)."""


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


class SurveyRequest(msgspec.Struct, frozen=True):
    """What to look for on a host: bb's leftovers, with the worktrees and branches of `repos`,
    and which of `workspaces` (recorded paths, by provider id) are gone."""

    host_id: str
    repos: list[str]
    workspaces: list[tuple[str, str]]


class Survey(msgspec.Struct, frozen=True):
    found: list[Leftover]
    absent: list[str]
    """The recorded workspaces asked about that do not exist on the host."""


class Protected(msgspec.Struct, frozen=True):
    """What live environments record, which doctor never touches: workspace paths and claimed
    paths (canonical), branches as `<repo>:<branch>`, and path keys by provider id."""

    paths: list[str]
    branches: list[str]
    path_keys: list[tuple[str, str]]

    def covers(self, leftover: Leftover) -> bool:
        if leftover.kind == "branch" and leftover.path in self.branches:
            return True
        if leftover.path_key is not None and (leftover.provider_id, leftover.path_key) in self.path_keys:
            return True
        return leftover.kind != "branch" and any(
            _nested(leftover.path, path) or _nested(path, leftover.path) for path in self.paths
        )


def _nested(inner: str, outer: str) -> bool:
    """Whether canonical path `inner` is `outer` or lies inside it."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


class LeftoverRemoval(msgspec.Struct, frozen=True):
    """Remove a leftover after saving its work, unless what live environments record covers it
    now (the host checks again, just before it removes anything)."""

    host_id: str
    leftover: Leftover
    protected: Protected


class DiskUsageRequest(msgspec.Struct, frozen=True):
    """Which workspaces of a host to measure: recorded paths, by provider id."""

    host_id: str
    workspaces: list[tuple[str, str]]


class DiskUsage(msgspec.Struct, frozen=True):
    """The bytes each workspace asked about takes, by path, as `du -sb` counts them
    (providers/host/disk_usage.py); a path that is not a directory of a provider that keeps its
    workspaces on this host is left out."""

    bytes: dict[str, int]
