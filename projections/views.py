"""The read side's documents: what `show`, `list` and `thread list` answer (SPEC §3)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from bus import documents as d
from domain.status import HookStatus


class HookView(msgspec.Struct, rename="camel"):
    status: str | None = None
    operation_id: str | None = None


class HooksView(msgspec.Struct):
    setup: HookView = msgspec.field(default_factory=HookView)
    teardown: HookView = msgspec.field(default_factory=HookView)


class EnvironmentView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    status: str
    status_message: str | None
    provider_id: str
    host_id: str
    project_path: str | None
    path: str | None
    owns_path: bool
    path_key: str
    inputs: Any
    thread_ids: list[str]
    merge_base_branch: str | None
    hooks: HooksView
    created_at: datetime
    updated_at: datetime
    version: int
    attempt: int = 1
    claimed_path: str | None = None
    retire_at: datetime | None = None
    removal_attempt: int = 0
    paused_at: datetime | None = None
    transcript: list[str] = msgspec.field(default_factory=list)


class ThreadView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    environment_id: str | None
    status: str
    parent_thread_id: str | None
    project_path: str | None = None
    refusal: str | None = None


def new_environment(event: d.Claimed) -> EnvironmentView:
    return EnvironmentView(
        id=event.environment_id, status=event.status, status_message=event.status_message,
        provider_id=event.provider_id, host_id=event.host_id, project_path=event.project_path,
        path=None, owns_path=False, path_key=event.path_key, inputs=event.inputs,
        thread_ids=event.thread_ids, merge_base_branch=None, hooks=HooksView(),
        created_at=event.occurred_at, updated_at=event.occurred_at, version=event.version,
        claimed_path=event.claimed_path,
    )


def apply_to_environment(view: EnvironmentView, event: d.EnvironmentEvent) -> None:
    """Fold one environment event into its view (every event carries status and threads)."""
    view.status = event.status
    view.status_message = event.status_message
    view.thread_ids = event.thread_ids
    view.version = event.version
    view.updated_at = event.occurred_at
    match event:
        case d.Created():
            view.path, view.owns_path = event.path, event.owns_path
            view.merge_base_branch, view.attempt = event.merge_base_branch, event.attempt
        case d.CreateRetried():
            view.attempt, view.path_key, view.claimed_path = event.attempt, event.path_key, event.claimed_path
        case d.SetupStarted() | d.SetupSucceeded():
            status = HookStatus.RUNNING if isinstance(event, d.SetupStarted) else HookStatus.SUCCEEDED
            view.hooks.setup = HookView(status, event.operation_id)
        case d.SetupFailed():
            view.hooks.setup = HookView(HookStatus.FAILED, event.operation_id)
        case d.SetupSkipped():
            view.hooks.setup = HookView(HookStatus.SKIPPED, None)
        case d.SetupRetried():
            view.hooks.setup = HookView(None, view.hooks.setup.operation_id)
        case d.RetireScheduled():
            view.retire_at = event.retire_at
        case d.RetireCancelled() | d.RemovalStarted():
            view.retire_at = None
            if isinstance(event, d.RemovalStarted):
                view.removal_attempt = event.removal_attempt
        case d.TeardownStarted():
            view.hooks.teardown = HookView(HookStatus.RUNNING, event.operation_id)
        case d.TeardownFinished():
            status = HookStatus.SUCCEEDED if event.outcome == HookStatus.SUCCEEDED else HookStatus.FAILED
            view.hooks.teardown = HookView(status, event.operation_id)
        case d.TeardownSkipped():
            view.hooks.teardown = HookView(HookStatus.SKIPPED, None)
        case d.Paused() | d.Resumed():
            view.paused_at = event.paused_at if isinstance(event, d.Paused) else None
        case d.Removed():
            view.path = None
