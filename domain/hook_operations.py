"""The values a hook operation is known by, on the core's side and on the host's alike.

Plain values and no event library: a host agent takes what the log recorded of an operation
(`RecordedHook`) and answers with an outcome (`HookOutcome`) without importing the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

HookKind = Literal["setup", "teardown"]
HookOutcomeStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "skipped", "interrupted"]
"""How one run of a hook ended (the environment's own view of its hook is domain.status.HookStatus)."""

SCRIPT_NAMES: dict[HookKind, str] = {"setup": ".bb-env-setup.sh", "teardown": ".bb-env-teardown.sh"}

MADE_EMPTY_REASON = "no .bb-env-setup.sh: the workspace was made empty"
"""Why a setup is skipped in a workspace its provider has just made empty."""


class HookOutcome(msgspec.Struct, frozen=True):
    status: HookOutcomeStatus
    exit_code: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class RecordedHook:
    """What the log recorded for one hook operation id: all a host agent may act on."""

    operation_id: str
    environment_id: str
    kind: HookKind
    host_id: str
    workspace: str | None
    awaited: bool
    """Started and its outcome not recorded: the hook may run (or be joined) now."""
    stoppable: bool
    """Stopping it loses nothing the log still waits for (see Environment.may_stop_hook)."""
    environment_removed: bool
    """Its environment is removed: nothing will wait for this operation's outcome again."""
    slug: str | None = None
    """The environment's name on its host (None: claimed by a release before leases, or a core of one)."""
    ports: str | None = None
    """The environment's port block, `first-last` (None: as `slug`)."""

    def given_variables(self) -> dict[str, str]:
        """The variables the core gives the hook on purpose (docs/concepts.md, Hooks), from what the
        log recorded: the only ones of the service's kind a hook sees (providers/host/withheld.py).
        One line each; what the environment leased (SPEC 11) only where it has it."""
        return {
            "BB_ENVIRONMENT_ID": self.environment_id,
            **({"BB_ENVIRONMENT_SLUG": self.slug} if self.slug else {}),
            **({"BB_PORT": self.ports.split("-")[0], "BB_PORTS": self.ports} if self.ports else {}),
        }
