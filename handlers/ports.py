"""What the core asks of the world outside its store, and the failures it waits on."""

from __future__ import annotations

from typing import Protocol

from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
# The port's failure and the transcript are the contract's too: a host's workspaces raise it and write to it.
from bb_environments.providers.contract import ProviderMissing as ProviderMissing
from bb_environments.providers.contract import Transcript as Transcript


class HostUnavailable(Exception):
    """No agent answers for the host (or it refused): the step waits and is asked again later.

    What a port that reaches its host over a network (the host agent's client) raises; the
    provisioning driver waits on it without knowing how the work travels."""


class Hooks(Protocol):
    """Runs hooks on the environment's host (the host agent), at most once per operation id.

    `known` is what the log says of the operation, read off the environment as the writer
    returned it to this process (see Environment.current_hook): an agent in this process may take it instead
    of asking the log again; any other agent asks its own."""

    async def run(self, host_id: str, environment_id: str, operation_id: str, kind: HookKind,
                  workspace: str, known: RecordedHook | None = None) -> HookOutcome: ...

    async def cancel(self, host_id: str, operation_id: str) -> str: ...
