"""The read side's documents: what `show`, `list` and `thread list` answer (SPEC §3).

Each is the public view of an aggregate's state, taken from the aggregate just after each event
(`public_view`), never folded from the events a second time: the aggregate is the one place
that says what an event changes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from bb_environments.domain.environment import Environment
from bb_environments.domain.status import HookStatus
from bb_environments.domain.thread import Thread


class HookView(msgspec.Struct, rename="camel"):
    status: str | None = None
    operation_id: str | None = None


class HooksView(msgspec.Struct):
    setup: HookView = msgspec.field(default_factory=HookView)
    teardown: HookView = msgspec.field(default_factory=HookView)


class PortsView(msgspec.Struct):
    first: int
    count: int


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
    saved_ref: str | None = None
    slug: str | None = None
    ports: PortsView | None = None
    disk_bytes: int | None = None
    """The workspace's size as last measured (SPEC 11); None until measured."""
    pool_id: str | None = None
    """The pool it was prepared for (SPEC 10), bound to a thread since or not."""
    pooled: bool = False
    """A pool's member ready for a thread, that none has taken yet."""
    transcript: list[str] = msgspec.field(default_factory=list)


class ThreadView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    environment_id: str | None
    status: str
    parent_thread_id: str | None
    project_path: str | None = None
    refusal: str | None = None


class ViewPage(NamedTuple):
    """A page of the log as a rebuild of the read model needs it: for each aggregate its
    notifications touched, the view just after the last of them, in the order of those last
    notifications (a later view of an aggregate replaces an earlier one, so nothing is lost)."""

    reached: int
    """The last notification id read (the page's `after` when it read none)."""
    events: int
    views: list[EnvironmentView | ThreadView]


class TranscriptEntry(NamedTuple):
    """A transcript line as the read model keeps it: which environment, where in the transcripts'
    stream, and whether it is a step of the work or a line printed."""

    sequence: int
    environment_id: str
    is_step: bool
    text: str


VIEWED_AGGREGATES = (Environment, Thread)
"""The aggregates the read model keeps a view of; `public_view` is None for any other."""


def public_view(aggregate: Any) -> EnvironmentView | ThreadView | None:
    """What the read model keeps of an aggregate just after one of its events (None: nothing)."""
    if isinstance(aggregate, Environment):
        return environment_view(aggregate)
    if isinstance(aggregate, Thread):
        return thread_view(aggregate)
    return None


def environment_view(environment: Environment) -> EnvironmentView:
    return EnvironmentView(
        id=str(environment.id),
        status=environment.public_status,
        status_message=environment.status_message,
        provider_id=environment.provider_id,
        host_id=environment.host_id,
        project_path=environment.project_path,
        path=environment.path,
        owns_path=environment.owns_path,
        path_key=environment.path_key,
        inputs=environment.inputs,
        thread_ids=list(environment.thread_ids),
        merge_base_branch=environment.merge_base_branch,
        hooks=HooksView(
            _hook(environment.setup_status, environment.setup_operation_id),
            _hook(environment.teardown_status, environment.teardown_operation_id),
        ),
        created_at=environment.created_on,
        updated_at=environment.modified_on,
        version=environment.version,
        attempt=environment.attempt,
        claimed_path=environment.claimed_path,
        retire_at=environment.retire_at,
        removal_attempt=environment.removal_attempt,
        paused_at=environment.paused_at,
        saved_ref=environment.saved_ref,
        slug=environment.slug,
        ports=PortsView(environment.ports.first, environment.ports.count) if environment.ports else None,
        disk_bytes=environment.disk_bytes,
        pool_id=environment.pool_id,
        pooled=environment.pooled,
    )


def _hook(status: HookStatus | None, operation_id: str | None) -> HookView:
    # A skipped hook ran no operation (one recorded before, by a setup that failed, is history).
    return HookView(status, None if status == HookStatus.SKIPPED else operation_id)


def thread_view(thread: Thread) -> ThreadView:
    return ThreadView(
        id=thread.thread_id,
        environment_id=str(thread.environment_id) if thread.environment_id else None,
        status=thread.status,
        parent_thread_id=thread.parent_thread_id,
        project_path=thread.project_path,
        refusal=thread.refusal,
    )
