"""The messages between the core and a host agent, and `VERBS`: each thing a host does for the
core, listed once, with its request, its answer and how it travels.

A verb is a job or a query. A job (a create, a removal, a hook: what changes the host) is queued
in BB_HOST_JOBS under the host's subjects and answered by a report the agent stores in
BB_HOST_REPORTS (bus/core/job_queue.py, bus/agent/job_worker.py). A query (a plan, the providers,
a survey, a hook's output: what only looks, or stops a hook) is a request on
bb.hosts.<hostId>.workspaces.<verb> or bb.hosts.<hostId>.hooks.<verb>, answered at once. The core
asks through bus/core/remote_host.py; the agent answers every row with its `LocalHost`
(bus/agent/host_service.py, bus/agent/job_worker.py). Besides: the agent's questions to the log
and its heartbeat.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import msgspec

from bb_environments.bus.wire import subjects
from bb_environments.domain.hook_operations import HookKind, HookOutcome, RecordedHook
from bb_environments.providers.contract import CreateFailed, CreateResult, HostUnavailable, RemoveFailed, RemoveResult
from bb_environments.providers.registry import ProviderDescription
from bb_environments.providers.workspace_messages import (
    BindRequest,
    BindResult,
    CreateRequest,
    DiskUsage,
    DiskUsageRequest,
    LeftoverRemoval,
    Plan,
    PlanRequest,
    RemoveRequest,
    Survey,
    SurveyRequest,
)


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


class HookSecretsAnswer(msgspec.Struct, frozen=True, rename="camel"):
    """The secrets a hook gets as variables (SPEC 11): only in a reply on its agent's own inbox."""

    secrets: dict[str, str]


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


# -- the verbs -------------------------------------------------------------------------------------

Answering = Callable[[Any, str, Any], Awaitable[Any]]
"""How an agent answers a verb with its host (hooks/local_host.py `LocalHost`): (host, the agent's
host id, the request) -> the answer. The host is `Any` here: the wire knows no host's code."""


@dataclass(frozen=True)
class HostVerb:
    name: str
    """A query's subject's last token, or a job's tag."""
    kind: Literal["job", "query"]
    request: Any
    """What the core sends: a query's body, or the job."""
    answer: Any
    """What comes back: a query's answer (for a workspaces query, inside a `WorkspaceAnswer`), or the job's report."""
    answered_by: Answering
    of_hooks: bool = False
    """A query of the agent's hooks (bb.hosts.<hostId>.hooks.<name>, refused with an error header)
    rather than of its workspaces (bb.hosts.<hostId>.workspaces.<name>, refused by name)."""

    def subject(self, host_id: str) -> str:
        """A query's subject (a job's is its operation's: subjects.host_job)."""
        return (
            subjects.host_hooks(host_id, self.name) if self.of_hooks else subjects.host_workspaces(host_id, self.name)
        )


async def _create(host: Any, host_id: str, job: CreateJob) -> CreateReport:
    if job.request.host_id != host_id:
        return CreateReport(job.operation_id, CreateFailed("terminal", _not_ours(job.request.host_id, host_id)))
    return CreateReport(job.operation_id, await host.create(job.request, threading.Event()))


async def _remove(host: Any, host_id: str, job: RemoveJob) -> RemoveReport:
    if job.request.host_id != host_id:
        return RemoveReport(job.operation_id, RemoveFailed(_not_ours(job.request.host_id, host_id)))
    return RemoveReport(job.operation_id, await host.remove(job.request, threading.Event()))


async def _hook(host: Any, host_id: str, job: HookJob) -> HookReport:
    start = job.start
    try:
        return HookReport(
            job.operation_id,
            await host.run_hook(host_id, start.environment_id, job.operation_id, start.kind, start.workspace),
        )
    except HostUnavailable as refused:  # the log, as the agent's ledger reads it, does not back it
        return HookReport(job.operation_id, None, str(refused))


def _not_ours(asked: str, ours: str) -> str:
    return f"this job names host {asked!r}; it was queued for host {ours!r}"


async def _start(host: Any, host_id: str, start: StartHook) -> HookState:
    await host.start_hook(start.operation_id, start.kind, start.environment_id, start.workspace)
    return HookState(state="running")


async def _status(host: Any, host_id: str, ref: HookRef) -> HookState:
    state, outcome = await host.hook_state(ref.operation_id)
    return HookState(state=state, outcome=outcome)


async def _cancel(host: Any, host_id: str, ref: HookRef) -> HookCancelled:
    return HookCancelled(await host.cancel_hook(host_id, ref.operation_id))


async def _output(host: Any, host_id: str, asked: HookOutputRequest) -> HookOutputPage:
    text, next_offset, more = await host.hook_output(host_id, asked.operation_id, asked.offset)
    return HookOutputPage(text=text, next_offset=next_offset, more=more)


VERBS: tuple[HostVerb, ...] = (
    HostVerb("create", "job", CreateJob, CreateReport, _create),
    HostVerb("remove", "job", RemoveJob, RemoveReport, _remove),
    HostVerb("hook", "job", HookJob, HookReport, _hook),
    HostVerb("providers", "query", NoArguments, ProviderList, lambda host, host_id, _: host.providers(host_id)),
    HostVerb(
        "inputs",
        "query",
        InputsQuery,
        Any,
        lambda host, host_id, query: host.inputs(host_id, query.provider_id, query.inputs),
    ),
    HostVerb(
        "canonical-project",
        "query",
        ProjectQuery,
        str | None,
        lambda host, host_id, query: host.canonical_project(host_id, query.project_path),
    ),
    HostVerb("plan", "query", PlanRequest, Plan, lambda host, _, request: host.plan(request)),
    HostVerb("planned-path", "query", PlanRequest, str | None, lambda host, _, request: host.planned_path(request)),
    HostVerb("survey", "query", SurveyRequest, Survey, lambda host, _, request: host.survey(request)),
    HostVerb(
        "remove-leftover",
        "query",
        LeftoverRemoval,
        RemoveResult,
        lambda host, _, request: host.remove_leftover(request),
    ),
    HostVerb("bind", "query", BindRequest, BindResult, lambda host, _, request: host.bind(request)),
    HostVerb("disk-usage", "query", DiskUsageRequest, DiskUsage, lambda host, _, request: host.disk_usage(request)),
    HostVerb("start", "query", StartHook, HookState, _start, of_hooks=True),
    HostVerb("status", "query", HookRef, HookState, _status, of_hooks=True),
    HostVerb("cancel", "query", HookRef, HookCancelled, _cancel, of_hooks=True),
    HostVerb("output", "query", HookOutputRequest, HookOutputPage, _output, of_hooks=True),
)
VERB = {verb.name: verb for verb in VERBS}
