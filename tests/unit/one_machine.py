"""A stand-in for the core's `Hosts` (handlers/ports.py): every host's work done by one machine,
whose workspace verbs are `workspaces`' (a LocalWorkspaces, or a stand-in host) and whose hook
verbs are `hooks`'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bb_environments.providers.registry import ProviderProfile

HOOK_VERBS = frozenset({"run_hook", "cancel_hook", "hook_output"})


class OneMachine:
    def __init__(self, workspaces: Any, hooks: Any = None) -> None:
        self._machine = _Machine(workspaces, hooks)
        self._workspaces = workspaces

    def host(self, host_id: str, provider_id: str | None = None) -> Any:
        return self._machine

    def profiles(self) -> Mapping[str, ProviderProfile]:
        return self._workspaces.profiles("local")

    async def inputs(self, provider_id: str, inputs: Any) -> Any:
        return await self._workspaces.inputs("local", provider_id, inputs)


class _Machine:
    def __init__(self, workspaces: Any, hooks: Any) -> None:
        self._workspaces = workspaces
        self._hooks = hooks

    def __getattr__(self, verb: str) -> Any:
        return getattr(self._hooks if verb in HOOK_VERBS else self._workspaces, verb)
