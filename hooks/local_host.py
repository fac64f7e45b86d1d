"""Everything this machine does for the core, in process: its workspaces and its guarded hooks.

One `LocalHost` serves a host wherever its agent runs: `bb agent` answers the bus with it
(bus/agent/host_service.py, bus/agent/job_worker.py), and `bb serve` both answers the bus with it
(another replica may drive an environment of its host) and hands it to its own core as that host
(handlers/hosts.py), so a hook of its own host costs no request over the bus and no `finished`
message to wait for (two round trips on the way to `ready`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.hooks.guarded import GuardedHooks, HookState
from bb_environments.providers.contract import HostUnavailable, Transcript
from bb_environments.providers.host.containment import Containment
from bb_environments.providers.host.workspace_user import WorkspaceUser
from bb_environments.providers.registry import ProviderRegistry
from bb_environments.providers.workspaces import LocalWorkspaces


class LocalHost(LocalWorkspaces):
    def __init__(
        self,
        registry: ProviderRegistry,
        data_dir: Path,
        transcript: Transcript,
        *,
        hooks: GuardedHooks | None = None,
        earlier_data_dir: Path | None = None,
        containment: Containment | None = None,
        workspace_user: WorkspaceUser | None = None,
    ) -> None:
        """`hooks`: this host's (None: the core's own providers, whose hooks run on the host an
        environment names); the rest is LocalWorkspaces'."""
        super().__init__(
            registry,
            data_dir,
            transcript,
            earlier_data_dir=earlier_data_dir,
            containment=containment,
            workspace_user=workspace_user,
        )
        self._hooks = hooks

    @property
    def hooks(self) -> GuardedHooks:
        if self._hooks is None:
            raise HostUnavailable("no hooks run in this process")
        return self._hooks

    async def run_hook(
        self,
        host_id: str,
        environment_id: str,
        operation_id: str,
        kind: HookKind,
        workspace: str,
        known: RecordedHook | None = None,
    ) -> HookOutcome:
        """`known`: the core's own answer from the log, which spares a second trip to the store's writer."""
        running = await self.hooks.start_or_join(operation_id, kind, environment_id, workspace, known)
        # Shielded: whoever waits giving up (the core stopping) must not cancel the run.
        return await asyncio.shield(running)

    async def start_hook(self, operation_id: str, kind: HookKind, environment_id: str, workspace: str) -> None:
        """Begin or join the hook without waiting for its end (the agent's `start` request)."""
        await self.hooks.start_or_join(operation_id, kind, environment_id, workspace)

    async def hook_state(self, operation_id: str) -> HookState:
        return await self.hooks.state(operation_id)

    async def cancel_hook(self, host_id: str, operation_id: str) -> str:
        return await self.hooks.cancel(operation_id)

    async def hook_output(self, host_id: str, operation_id: str, offset: int) -> tuple[str, int, bool]:
        return await self.hooks.output(operation_id, offset)
