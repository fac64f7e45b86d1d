"""The requests and answers between the core and a host agent (bb.hosts.<hostId>.hooks.*)."""

from __future__ import annotations

from typing import Literal

import msgspec

from bb_environments.domain.hook_operations import HookKind, HookOutcome


class StartHook(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    operation_id: str
    kind: HookKind
    workspace: str
    environment_id: str


class HookRef(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    operation_id: str


class HookState(msgspec.Struct, rename="camel", kw_only=True):
    state: Literal["running", "finished", "unknown"]
    outcome: HookOutcome | None = None


class HookCancelled(msgspec.Struct, rename="camel"):
    result: str
