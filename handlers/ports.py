"""What the core asks of the world outside its store, and the failures it waits on."""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.providers.contract import CreateResult, RemoveResult

# The port's failures and the transcript are the contract's too: a host raises them and writes to it.
from bb_environments.providers.contract import HostUnavailable as HostUnavailable
from bb_environments.providers.contract import ProviderMissing as ProviderMissing
from bb_environments.providers.contract import Transcript as Transcript
from bb_environments.providers.registry import ProviderDescription, ProviderProfile
from bb_environments.providers.workspace_messages import (
    BindRequest,
    BindResult,
    CreateRequest,
    DiskUsage,
    DiskUsageRequest,
    LeftoverRemoval,
    PauseResult,
    Plan,
    PlanRequest,
    RemoveRequest,
    ResourceRequest,
    ResumeResult,
    Survey,
    SurveyRequest,
)


class Host(Protocol):
    """Everything the core asks of a machine: its providers' workspaces and its hooks. The
    providers' code, data and filesystem are there, never in the core.

    Every call names the host it is for (its `host_id`, or its request's), with the messages of
    providers/workspace_messages.py. The in-process host is hooks/local_host.py's `LocalHost`; a
    host whose agent runs elsewhere is bus/core/remote_host.py's `RemoteHost`, which asks the
    agent over the bus as bus/wire/host_protocol.py's VERBS say; handlers/hosts.py picks one per
    call. A call raises `ProviderMissing` when the host has no such provider now, and
    `HostUnavailable` when nobody answers for the host (or its agent refused a hook the log does
    not back yet): the step waits and asks again. A refused request raises the contract's
    `InvalidInputs` (its message names the field) or `PlanRefused` (the provider cannot create there now)."""

    async def providers(self, host_id: str) -> list[ProviderDescription]:
        """The host's providers with whether each can create there now, in id order."""
        ...

    async def inputs(self, host_id: str, provider_id: str, inputs: Any) -> Any:
        """`inputs` as the provider's type reads them (as plain data): what the log keeps of them."""
        ...

    async def canonical_project(self, host_id: str, project_path: str | None) -> str | None:
        """The project path in the host's canonical form (symlinks resolved)."""
        ...

    async def plan(self, request: PlanRequest) -> Plan:
        """Check a new environment's request on its host (its project within `project_roots`
        before anything runs in it) and plan the path it claims."""
        ...

    async def planned_path(self, request: PlanRequest) -> str | None:
        """The canonical path a later attempt of a placed environment claims (None: not knowable)."""
        ...

    async def create(self, request: CreateRequest, cancelled: threading.Event) -> CreateResult:
        """Run one create attempt; `cancelled` set asks it to stop. `Created.path` is canonical."""
        ...

    async def remove(self, request: RemoveRequest, cancelled: threading.Event) -> RemoveResult:
        """Remove what a create attempt made or left (a removal, or the cleanup of a failed attempt)."""
        ...

    async def idle_pause_due(self, host_id: str, provider_id: str, last_activity: datetime, now: datetime) -> bool: ...

    async def pause(
        self, request: ResourceRequest, checkpoint: Callable[[dict[str, Any]], Coroutine[Any, Any, object]]
    ) -> PauseResult:
        """Suspend the resource; `checkpoint` records the resumable one before anything is stopped."""
        ...

    async def resume(self, request: ResourceRequest) -> ResumeResult: ...

    async def survey(self, request: SurveyRequest) -> Survey:
        """What bb's layout left on the host (its providers' directories, and the worktrees and
        `bb/` branches of `request.repos`), and which recorded workspaces are gone."""
        ...

    async def remove_leftover(self, request: LeftoverRemoval) -> RemoveResult:
        """Save a leftover's work, then remove it (`Removed.saved_ref` names the save)."""
        ...

    async def bind(self, request: BindRequest) -> BindResult:
        """Give a pool's member bound to a thread the thread's identity (its branch); safe to ask again."""

    async def disk_usage(self, request: DiskUsageRequest) -> DiskUsage:
        """The bytes each recorded workspace asked about takes on the host, as `du -sb` counts
        them (a path the host keeps no workspace at is left out)."""
        ...

    async def run_hook(
        self,
        host_id: str,
        environment_id: str,
        operation_id: str,
        kind: HookKind,
        workspace: str,
        known: RecordedHook | None = None,
    ) -> HookOutcome:
        """Run a hook at most once per operation id, as the log allows (hooks/ledger.py).

        `known` is what the log says of the operation, read off the environment as the writer
        returned it to this process (see Environment.current_hook): a host in this process may
        take it instead of asking the log again; any other asks its own."""
        ...

    async def cancel_hook(self, host_id: str, operation_id: str) -> str: ...

    async def hook_output(self, host_id: str, operation_id: str, offset: int) -> tuple[str, int, bool]:
        """A page of the operation's output as its host keeps it: the text, the offset of the next
        page, and whether one follows."""
        ...


class Hosts(Protocol):
    """Which `Host` does a host's work: the one in this process, the core's own (the cloud
    providers'), or the host's agent over the bus (handlers/hosts.py)."""

    def host(self, host_id: str, provider_id: str | None = None) -> Host:
        """The host that does `host_id`'s work; for a call about one provider's environment,
        `provider_id` (a cloud provider's work is the core's, whichever host it names)."""
        ...

    def profiles(self) -> Mapping[str, ProviderProfile]:
        """The providers every host runs (every host runs the core's release), by id in id order."""
        ...

    async def inputs(self, provider_id: str, inputs: Any) -> Any:
        """`inputs` as the provider's type reads them, read by the core (the provider's type is
        its release's), so that a thread event's intent is checked while its host is away."""
        ...


@dataclass(frozen=True)
class AgentSeed:
    """A new seed for a host's agent, kept nowhere yet: the log records only its public key."""

    public_key: str
    seed: str = field(repr=False)


class HostDirectory(Protocol):
    """The registered hosts' agents as the bus knows them: the seeds this replica keeps, the bus's
    acceptance of them, and when each agent was last heard from. Which hosts are registered is the
    log's (handlers/host_registry.py), the same for every replica.

    Admitting a seed keeps it (replacing any the host had) and has the bus accept it at once;
    forgetting a host makes the seed kept here stop working at once."""

    def seeded(self) -> dict[str, str]:
        """Each host whose agent's seed this replica keeps, with the seed's public key."""
        ...

    def new_seed(self) -> AgentSeed: ...

    async def admit(self, host_id: str, seed: AgentSeed) -> str:
        """The path of the seed's file."""
        ...

    async def forget(self, host_id: str) -> None: ...

    async def last_seen(self, host_id: str) -> datetime | None: ...


class Share(Protocol):
    """Which environments this core replica drives: all of them when it is the only one; a share of
    them, changing as replicas come and go, when several share a store (SPEC 7.2)."""

    def drives(self, aggregate_id: UUID) -> bool: ...


class Everything:
    """The share of the only replica."""

    def drives(self, aggregate_id: UUID) -> bool:
        return True


class Outcomes(Protocol):
    """Whether the threads' placement outcomes an environment's log reached are out: published by
    this replica's follower of the log (bus/core/log_follower.py)."""

    async def out_for(self, environment_id: UUID, version: int) -> bool:
        """True once every outcome the environment's events up to `version` reached was published."""
        ...


class OutcomesUntold:
    """No placement outcomes are published (a core without the bus): nothing to wait for."""

    async def out_for(self, environment_id: UUID, version: int) -> bool:
        return True


class ActivityElsewhere(Protocol):
    """Where a thread's activity on an environment another replica drives goes: to that replica."""

    async def tell_driver(self, environment_id: UUID) -> None: ...


class NoOtherReplica:
    """The only replica drives every environment: there is nobody else to tell."""

    async def tell_driver(self, environment_id: UUID) -> None:
        raise AssertionError("the only replica drives every environment")
