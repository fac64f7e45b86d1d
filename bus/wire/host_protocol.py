"""The messages between the core and a host agent: the hook requests (bb.hosts.<hostId>.hooks.*),
the jobs queued for a host and the agent's reports of them, its read-only answers about its
workspaces, its questions to the log and its heartbeat."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.providers.contract import CreateResult, RemoveResult
from bb_environments.providers.registry import ProviderDescription
from bb_environments.providers.workspace_messages import CreateRequest, RemoveRequest


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


class HookOutputRequest(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    operation_id: str
    offset: int = 0


class HookOutputPage(msgspec.Struct, rename="camel", kw_only=True):
    """A page of a hook's output as its host keeps it (at most BB_HOOK_OUTPUT_MAX_BYTES in all), cut
    after a whole line where one ends in it; `nextOffset` asks for the next."""
    text: str
    next_offset: int
    more: bool


# -- jobs and reports ------------------------------------------------------------------------------

class CreateJob(msgspec.Struct, frozen=True, tag="create", tag_field="job", rename="camel"):
    operation_id: str
    request: CreateRequest


class RemoveJob(msgspec.Struct, frozen=True, tag="remove", tag_field="job", rename="camel"):
    operation_id: str
    request: RemoveRequest


class HookJob(msgspec.Struct, frozen=True, tag="hook", tag_field="job", rename="camel"):
    operation_id: str
    start: StartHook


HostJob = CreateJob | RemoveJob | HookJob


class CreateReport(msgspec.Struct, frozen=True, tag="create", tag_field="job", rename="camel"):
    operation_id: str
    result: CreateResult


class RemoveReport(msgspec.Struct, frozen=True, tag="remove", tag_field="job", rename="camel"):
    operation_id: str
    result: RemoveResult


class HookReport(msgspec.Struct, frozen=True, tag="hook", tag_field="job", rename="camel"):
    operation_id: str
    outcome: HookOutcome | None
    refused: str | None = None
    """Why the agent would not run it (the log, as the agent's ledger read it, did not back it)."""


HostReport = CreateReport | RemoveReport | HookReport


# -- the agent's questions and answers -------------------------------------------------------------

class RecordedHookAnswer(msgspec.Struct, frozen=True, rename="camel"):
    recorded: RecordedHook | None


class HostHeartbeat(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    """What an agent says of itself every few seconds (KV bucket BB_HOSTS, key = its host id)."""
    host_id: str
    seen_at: datetime
    root: str
    pid: int
    version: str


class InputsQuery(msgspec.Struct, frozen=True, rename="camel"):
    provider_id: str
    inputs: Any


class ProjectQuery(msgspec.Struct, frozen=True, rename="camel"):
    project_path: str | None


class NoArguments(msgspec.Struct, frozen=True):
    pass


class WorkspaceAnswer(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    """The answer to one of the agent's read-only questions (bb.hosts.<hostId>.workspaces.<verb>),
    or the port's refusal by name: the core raises the same exception the in-process port would."""
    answer: Any = None
    refused: Literal["invalid_inputs", "plan_refused", "provider_missing"] | None = None
    message: str | None = None


ProviderList = list[ProviderDescription]
