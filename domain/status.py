"""The statuses of the domain, each named once.

String enums: a member is its value (`EnvironmentStatus.READY == "ready"`), encodes as that value
in JSON and msgspec and binds as text in SQLite, so the documents on the bus, the read models and
the CLI's output read exactly as the bare strings did. The stored events hold no status (each is
derived when an event is applied), so no log written before these enums existed changes meaning.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

CreateFailure = Literal["transient", "terminal"]
"""Why a create failed: `transient` ones are retried after cleanup; `terminal` ones are final."""


class EnvironmentStatus(StrEnum):
    CREATING = "creating"
    PROVISIONING = "provisioning"
    READY = "ready"
    ERROR = "error"
    RETIRING = "retiring"
    """Public only: a `ready` or `error` environment with a retire deadline (see `public_status`)."""
    REMOVING = "removing"
    REMOVED = "removed"


LIVE_STATUSES = (
    EnvironmentStatus.CREATING,
    EnvironmentStatus.PROVISIONING,
    EnvironmentStatus.READY,
    EnvironmentStatus.ERROR,
)
PREPARING_STATUSES = (EnvironmentStatus.CREATING, EnvironmentStatus.PROVISIONING)
SETTLED_STATUSES = (EnvironmentStatus.READY, EnvironmentStatus.ERROR)
"""Live and no longer being prepared: these retire, and are removed once their deadline passed."""


class HookStatus(StrEnum):
    """Where an environment's setup or teardown hook stands (None: not started)."""

    RUNNING = "running"
    SKIPPED = "skipped"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ThreadStatus(StrEnum):
    ACTIVE = "active"
    ARCHIVED = "archived"
