"""The long steps that happen on an environment's host: each asks the host through the `Host` port
(its workspace's provider, or a hook) and records the answer as the environment's next event.

A step returns the environment as that event left it, or None when it failed without recording
anything (the driver runs it again later). The driver (provisioning.py) decides which step runs
and when; nothing here decides what comes next.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec
from uuid import UUID

from eventsourcing.persistence import OperationalError

from bb_environments.domain.environment import Environment
from bb_environments.domain.hook_operations import MADE_EMPTY_REASON, SCRIPT_NAMES, HookKind, HookOutcome
from bb_environments.handlers.ports import Hosts, Transcript
from bb_environments.handlers.store import Store
from bb_environments.providers.contract import Created, InvalidInputs, PlanRefused, Previous, Removed, RemoveResult
from bb_environments.providers.host.backoff import Backoff
from bb_environments.providers.host.crash_points import crash_point
from bb_environments.providers.workspace_messages import (
    BindRequest,
    CreateRequest,
    NotBound,
    PauseFailed,
    PlanRequest,
    RemoveRequest,
    ResourceRequest,
    ResumeFailed,
)

log = logging.getLogger(__name__)

P = ParamSpec("P")

REMOVE_RETRY = timedelta(seconds=60)


def _now() -> datetime:
    return datetime.now(UTC)


class HostSteps:
    def __init__(
        self, store: Store, hosts: Hosts, transcript: Transcript, measure_soon: Callable[[UUID], None]
    ) -> None:
        """`measure_soon`: told of each environment whose setup has just settled, so that its new
        workspace's size is known soon after it is ready."""
        self._store = store
        self._app = store.app
        self._hosts = hosts
        self._transcript = transcript
        self._measure_soon = measure_soon

    async def create(self, cancelled: threading.Event, env: Environment) -> Environment:
        profile = self._hosts.profiles().get(env.provider_id)
        if profile is None:
            # An unregistered provider cancels the creates it had pending; their cleanup waits for it.
            message = f"the environment provider {env.provider_id!r} is not registered"
            return await self._store.run(self._app.record_create_failed, env.id, env.attempt, "terminal", message)
        if not env.planned:
            return await self._plan(env)
        self._transcript.line(str(env.id), "step", "core", f"Preparing {profile.display_name} (attempt {env.attempt})")
        request = CreateRequest(
            environment_id=str(env.id),
            attempt=env.attempt,
            host_id=env.host_id,
            provider_id=env.provider_id,
            project_path=env.project_path,
            inputs=env.inputs,
            thread_id=env.thread_ids[0] if env.thread_ids else "",
            path_key=env.path_key,
            previous=Previous(env.attempt - 1, env.path, env.resource) if env.attempt > 1 else None,
        )
        result = await self._hosts.host(env.host_id, env.provider_id).create(request, cancelled)
        crash_point("create-returned")
        if isinstance(result, Created):
            if result.empty and result.owns_path:
                # A fact of this creation, said whatever the save below then records (an archive
                # meanwhile leads to removal instead of a skip).
                self._transcript.line(str(env.id), "step", "setup", MADE_EMPTY_REASON)
            created = await self._store.run(
                self._app.record_created,
                env.id,
                env.attempt,
                result.path,
                result.owns_path,
                result.merge_base_branch,
                result.resource,
                result.empty,
            )
            crash_point("created-recorded")
            if created.disk_measurable:  # its setup skipped with the creation (a workspace made empty)
                self._measure_soon(env.id)
            return created
        self._transcript.line(str(env.id), "output", env.provider_id, result.message)
        return await self._store.run(
            self._app.record_create_failed, env.id, env.attempt, result.failure, result.message
        )

    async def _plan(self, env: Environment) -> Environment:
        """The host's plan for an environment placed while the host was away: what its placement
        would have checked and claimed then is checked and claimed now, before the host makes anything.
        HostUnavailable (still away) leaves it as it is."""
        request = PlanRequest(env.host_id, env.provider_id, env.project_path, env.inputs, env.path_key)
        try:
            plan = await self._hosts.host(env.host_id, env.provider_id).plan(request)
        except (InvalidInputs, PlanRefused) as refused:
            return await self._store.run(self._app.record_create_failed, env.id, env.attempt, "terminal", str(refused))
        if plan.shares_claimed_path:
            message = (
                f"the workspace {plan.claimed_path} is another environment's; to share it, spawn with "
                "--environment and its id"
            )
            return await self._store.run(self._app.record_create_failed, env.id, env.attempt, "terminal", message)
        self._transcript.line(str(env.id), "step", "core", f"Host {env.host_id!r} planned the workspace")
        return await self._store.run(
            self._app.record_planned,
            env.id,
            env.attempt,
            plan.project_path,
            plan.inputs,
            plan.claimed_path,
            plan.listening,
        )

    async def clean_attempt(self, cancelled: threading.Event, env: Environment) -> Environment | None:
        result = await self._provider_remove(env, cancelled)
        if isinstance(result, Removed):
            return await self._store.run(self._app.record_attempt_cleaned, env.id, env.attempt)
        self._transcript.line(str(env.id), "output", env.provider_id, f"cleanup failed: {result.message}")
        return None

    async def remove(self, cancelled: threading.Event, env: Environment) -> Environment:
        result = await self._provider_remove(env, cancelled)
        crash_point("remove-returned")
        if isinstance(result, Removed):
            return await self._store.run(
                self._app.record_removed,
                env.id,
                env.removal_attempt,
                result.saved_ref,
                [{"path": file.path, "bytes": file.bytes} for file in result.not_saved],
            )
        self._transcript.line(str(env.id), "output", env.provider_id, f"removal failed: {result.message}")
        return await self._store.run(
            self._app.record_remove_failed, env.id, env.removal_attempt, result.message, _now() + REMOVE_RETRY
        )

    async def _provider_remove(self, env: Environment, cancelled: threading.Event) -> RemoveResult:
        request = RemoveRequest(
            environment_id=str(env.id),
            attempt=env.attempt,
            host_id=env.host_id,
            provider_id=env.provider_id,
            project_path=env.project_path,
            inputs=env.inputs,
            path=env.path,
            path_key=env.path_key,
            resource=env.resource,
            removal_attempt=env.removal_attempt,
            unbound_member=env.pool_id is not None and not env.bound,
        )
        return await self._hosts.host(env.host_id, env.provider_id).remove(request, cancelled)

    async def pause(
        self, cancelled: threading.Event, env: Environment, request: ResourceRequest, judged_idle_at: datetime
    ) -> Environment | None:
        """Recorded as paused at `judged_idle_at`: a thread's message while the pause ran is
        activity after it, which resumes the environment as soon as the pause is recorded."""
        self._transcript.line(str(env.id), "step", env.provider_id, "Pausing the idle environment")

        async def checkpoint(resource: dict[str, Any]) -> None:
            # Called by the provider mid-pause: its new handle is durable before it terminates anything.
            await self._store.run(self._app.record_resource, env.id, resource)

        result = await self._hosts.host(env.host_id, env.provider_id).pause(request, checkpoint)
        if isinstance(result, PauseFailed):
            self._transcript.line(str(env.id), "output", env.provider_id, f"pause failed: {result.message}")
            return None
        return await self._store.run(self._app.record_paused, env.id, result.resource, judged_idle_at)

    async def resume(
        self, cancelled: threading.Event, env: Environment, request: ResourceRequest
    ) -> Environment | None:
        self._transcript.line(str(env.id), "step", env.provider_id, "Resuming the environment")
        result = await self._hosts.host(env.host_id, env.provider_id).resume(request)
        crash_point("resume-returned")  # resumed, not recorded: the log still asks for it, and it runs again
        if isinstance(result, ResumeFailed):
            self._transcript.line(str(env.id), "output", env.provider_id, f"resume failed: {result.message}")
            return None
        return await self._store.run(self._app.record_resumed, env.id, result.resource)

    async def run_setup(self, cancelled: threading.Event, env: Environment, operation_id: str) -> Environment:
        """`operation_id` is the step's: the setup operation `env` recorded."""
        outcome = await self._run_hook(env, operation_id, "setup")
        crash_point("setup-finished")
        what = f"recording the setup outcome of environment {env.id}"
        if outcome.status == "skipped":  # the host found no script in the workspace
            settled = await self._save_outcome(
                what,
                self._app.record_setup_skipped,
                env.id,
                operation_id,
                outcome.message or f"no {SCRIPT_NAMES['setup']}",
            )
        else:
            settled = await self._save_outcome(
                what,
                self._app.record_setup_outcome,
                env.id,
                operation_id,
                outcome.status == "succeeded",
                outcome.message,
            )
        self._measure_soon(env.id)
        return settled

    async def bind(self, cancelled: threading.Event, env: Environment) -> Environment:
        """Give a pool's member bound to a thread the thread's identity on its host (its branch):
        asked again after a crash, the provider finds it done."""
        assert env.path is not None and env.thread_path_key is not None  # a member bound is a ready one's
        request = BindRequest(
            environment_id=str(env.id),
            host_id=env.host_id,
            provider_id=env.provider_id,
            project_path=env.project_path,
            inputs=env.inputs,
            path_key=env.thread_path_key,
            path=env.path,
            resource=env.resource,
        )
        self._transcript.line(
            str(env.id), "step", "core", f"Binding the pool's member to thread {env.origin_thread_id}"
        )
        result = await self._hosts.host(env.host_id, env.provider_id).bind(request)
        crash_point("bind-returned")
        if isinstance(result, NotBound):
            self._transcript.line(str(env.id), "output", env.provider_id, f"bind failed: {result.message}")
            return await self._store.run(self._app.record_bind_failed, env.id, result.message)
        return await self._store.run(self._app.record_bound, env.id, result.resource)

    async def run_teardown(self, cancelled: threading.Event, env: Environment, operation_id: str) -> Environment:
        """`operation_id` is the step's: the teardown operation `env` recorded."""
        outcome = await self._run_hook(env, operation_id, "teardown")
        crash_point("teardown-finished")
        what = f"recording the teardown outcome of environment {env.id}"
        if outcome.status == "skipped":  # the host found no script in the workspace
            return await self._save_outcome(
                what,
                self._app.record_teardown_skipped,
                env.id,
                operation_id,
                outcome.message or f"no {SCRIPT_NAMES['teardown']}",
            )
        return await self._save_outcome(
            what, self._app.record_teardown_outcome, env.id, operation_id, outcome.status, outcome.message
        )

    async def _save_outcome(
        self, what: str, command: Callable[P, Environment], *args: P.args, **kwargs: P.kwargs
    ) -> Environment:
        """Save a hook's outcome however long the store refuses it (a full disk, a lost database).

        The hook has run: given up on, the outcome would be asked for again only at the next
        sweep, with a traceback for each try.
        """
        backoff = Backoff(log, what)
        while True:
            try:
                saved = await self._store.run(command, *args, **kwargs)
            except (OperationalError, OSError) as error:
                await asyncio.sleep(backoff.failed(error))
                continue
            backoff.succeeded()
            return saved

    async def _run_hook(self, env: Environment, operation_id: str, kind: HookKind) -> HookOutcome:
        # The host's agent writes the hook's steps in the transcript, around its output.
        assert env.path is not None  # hooks run only in a workspace its provider created (and owns)
        return await self._hosts.host(env.host_id).run_hook(
            env.host_id, str(env.id), operation_id, kind, env.path, env.current_hook(operation_id)
        )
