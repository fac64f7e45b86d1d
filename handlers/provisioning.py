"""Drives each environment on from whatever state its log says it is in.

`drive(environment_id)` reads the aggregate (or takes it as a command just left it), asks it for
its next step (`Environment.next_step`: create, setup hook, removal, teardown hook, provider
remove, a timer...) and executes that step; what comes next is never decided here. Long steps
run as supervised tasks off the handler: the step is recorded first (an event naming its attempt
or operation), the task runs, and its outcome is recorded as the next event, after which the
environment is driven again. Because the decision depends only on recorded state, the same call
serves a fresh event, a redelivered one, the periodic sweep and recovery after a crash.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, assert_never
from uuid import UUID

import msgspec
from eventsourcing.persistence import OperationalError

from bb_environments.domain.hook_operations import MADE_EMPTY_REASON, SCRIPT_NAMES, HookKind, HookOutcome
from bb_environments.domain.environment import Environment
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.domain.steps import (
    CancelSetup,
    CleanAttempt,
    PauseWhenIdle,
    Remove,
    ResumeOnActivity,
    RetryRemoval,
    RetryTransient,
    RunCreate,
    RunSetup,
    RunTeardown,
    Settled,
    SkipSetup,
    SkipTeardown,
    StartRemoval,
    StartSetup,
    StartTeardown,
    StopCreate,
    WakeAt,
)
from bb_environments.providers.host.crash_points import crash_point
from bb_environments.handlers.placement import Placer, canonical_path
from bb_environments.handlers.ports import Hooks, HostUnavailable, ProviderMissing, Transcript
from bb_environments.handlers.store import Store
from bb_environments.providers.contract import (
    CreateContext,
    Created,
    CreateFailed,
    CreateResult,
    EnvironmentProvider,
    PausableProvider,
    Previous,
    RemoveContext,
    Removed,
    RemoveFailed,
    RemoveResult,
    is_pausable,
)
from bb_environments.providers.host.backoff import Backoff

log = logging.getLogger(__name__)

P = ParamSpec("P")

REMOVE_RETRY = timedelta(seconds=60)
CLEANUPS_AT_ONCE = 4


PROVIDER_RECHECK = timedelta(seconds=30)
FAILED_STEP_RETRY = timedelta(seconds=30)
"""How long a step that failed without recording anything (a cleanup, a pause, a resume) waits
before it runs again: the environment still asks for it, so at once would be a busy loop."""

_Work = Callable[Concatenate[threading.Event, P], Awaitable[Environment | None]]
"""A long step: it returns the environment as the event recording its outcome left it, or None
when it failed and recorded nothing (it runs again after FAILED_STEP_RETRY)."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class _TranscriptReporter:
    """A provider's `report`, writing its steps and logs into the environment's transcript."""

    transcript: Transcript
    environment_id: str
    source: str

    def step(self, text: str) -> None:
        self.transcript.line(self.environment_id, "step", self.source, text)

    def log(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            self.transcript.line(self.environment_id, "output", self.source, line)


@dataclass
class _Step:
    task: asyncio.Task[None]
    cancelled: threading.Event


class Provisioner:
    def __init__(self, store: Store, placer: Placer, hooks: Hooks, transcript: Transcript,
                 transient_retry_delay: timedelta = timedelta(seconds=30),
                 failed_step_retry: timedelta = FAILED_STEP_RETRY) -> None:
        self._store = store
        self._app = store.app
        self._placer = placer
        self._hooks = hooks
        self._transcript = transcript
        self._locks: dict[UUID, asyncio.Lock] = {}
        self._steps: dict[tuple[UUID, str], _Step] = {}
        self._timers: dict[UUID, asyncio.TimerHandle] = {}
        self._failed_steps: dict[tuple[UUID, str], datetime] = {}  # step -> when it may run again
        self._cleanup_slots = asyncio.Semaphore(CLEANUPS_AT_ONCE)
        self._host_slots: dict[str, asyncio.Semaphore] = {}
        self._transient_retry_delay = transient_retry_delay
        self._failed_step_retry = failed_step_retry
        self._activity: dict[UUID, datetime] = {}
        self._advanced_from: dict[UUID, int] = {}
        self._newest_known: dict[UUID, int] = {}  # see drive

    @property
    def busy(self) -> bool:
        """Some long step is running (tests wait for this to settle)."""
        return bool(self._steps)

    def note_activity(self, environment_id: UUID) -> None:
        """A thread of the environment did something (a message): it is not idle; wake it if paused."""
        self._activity[environment_id] = _now()

    async def drive(self, environment_id: UUID, known: Environment | None = None) -> None:
        """`known`: the environment as a command of this process has just left it, advanced from
        without a trip to the writer to read it again. Read again all the same when it may be out
        of date: this process advanced from it or a later version already, or a later version was
        handed to a drive that waits for the lock meanwhile (a step that ended while this drive
        waited: advancing from before its outcome would start that step again)."""
        if known is not None:
            self._newest_known[environment_id] = max(known.version, self._newest_known.get(environment_id, 0))
        lock = self._locks.setdefault(environment_id, asyncio.Lock())
        async with lock:
            # `_newest_known` may have been forgotten meanwhile (the environment was removed): then
            # `_advanced_from`, which is kept, sends this drive to read it.
            if known is None or self._advanced_from.get(environment_id, 0) >= known.version \
                    or self._newest_known.get(environment_id, 0) > known.version:
                known = await self._store.run(self._app.environment, environment_id)
            await self._advance(known)

    async def catch_up(self, environment_id: UUID, version: int) -> None:
        """Drive an environment for an event from the log, unless this process already advanced
        from that version (it usually recorded the event itself a moment ago)."""
        if self._advanced_from.get(environment_id, 0) < version:
            await self.drive(environment_id)

    async def sweep(self) -> None:
        """Drive every environment whose log has not ended: recovery, deadlines, retries."""
        for environment_id in await self._store.run(self._app.unfinished_environment_ids):
            try:
                await self.drive(environment_id)
            except Exception:
                log.exception("sweep could not drive environment %s", environment_id)

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        steps = list(self._steps.values())
        for step in steps:
            step.cancelled.set()  # provider calls on worker threads must return for the process to exit
            step.task.cancel()
        tasks = [step.task for step in steps]
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- executing the aggregate's next step ---------------------------------------------------

    async def _advance(self, env: Environment) -> None:
        """Execute the step the aggregate asks for now: record it, start its long work, or wait."""
        self._advanced_from[env.id] = max(env.version, self._advanced_from.get(env.id, 0))
        now = _now()
        match env.next_step(now, self._transient_retry_delay):
            case RunCreate(attempt):
                self._start(env, f"create.{attempt}", self._create, env)
            case StopCreate(attempt):
                await self._stop_create(env, attempt, now)
            case StartSetup():
                await self._record(env, self._app.start_setup)
            case SkipSetup(reason):
                await self._record(env, self._app.skip_setup, reason)
            case RunSetup(operation_id):
                self._start(env, operation_id, self._run_setup, env, operation_id)
            case CancelSetup(operation_id):
                self._start(env, operation_id, self._run_setup, env, operation_id)  # its outcome is still recorded
                try:
                    await self._hooks.cancel(env.host_id, operation_id)
                except HostUnavailable as unavailable:
                    # Asked again at the next drive (the sweep's at the latest); an outage of the
                    # bus is reported once, by the bus's health, not here at every sweep.
                    log.debug("could not stop the setup of environment %s yet: %s", env.id, unavailable)
            case StartRemoval() | RetryRemoval():
                await self._record(env, self._app.start_removal, now)
            case CleanAttempt(attempt):
                self._start(env, f"cleanup.{attempt}", self._clean_attempt, env)
            case RetryTransient():
                await self._retry_transient(env)
            case WakeAt(when):
                self._wake_at(env.id, when)
            case PauseWhenIdle(quiet_since):
                await self._pause_if_idle(env, quiet_since, now)
            case ResumeOnActivity(paused_at):
                self._resume_on_activity(env, paused_at)
            case StartTeardown():
                await self._record(env, self._app.start_teardown)
            case SkipTeardown(reason):
                await self._record(env, self._app.skip_teardown, reason)
            case RunTeardown(operation_id):
                self._start(env, operation_id, self._run_teardown, env, operation_id)
            case Remove(removal_attempt):
                self._start(env, f"remove.{removal_attempt}", self._remove, env)
            case Settled():
                if env.status == EnvironmentStatus.REMOVED:
                    self._forget(env.id)
            case unexpected:
                assert_never(unexpected)

    async def _record(self, env: Environment, command: Callable[Concatenate[UUID, P], object],
                      *args: P.args, **kwargs: P.kwargs) -> None:
        """Record a step, then drive on from the state it produced (if it produced one)."""
        outcome = await self._store.run(command, env.id, *args, **kwargs)
        environment = outcome[0] if isinstance(outcome, tuple) else outcome
        assert isinstance(environment, Environment)
        if environment.version != env.version:
            await self._advance(environment)

    def _start(self, env: Environment, key: str, work: _Work[P], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run a long step once per process; when it ends, drive the environment again (from the
        state the step's outcome left it in, if it recorded one)."""
        step_key = (env.id, key)
        if step_key in self._steps:
            return
        if self._newest_known.get(env.id, 0) > env.version:
            # A step ended while this drive awaited (its outcome's drive waits for the lock): this
            # state is out of date, and the later one decides; from this one the step would run again.
            return
        if (retry_at := self._failed_steps.get(step_key)) is not None and _now() < retry_at:
            self._wake_at(env.id, retry_at)  # a sweep's drive meanwhile starts nothing
            return
        cancelled = threading.Event()
        task = asyncio.create_task(self._supervise(step_key, work, cancelled, *args, **kwargs))
        self._steps[step_key] = _Step(task, cancelled)

    async def _supervise(self, step_key: tuple[UUID, str], work: _Work[P], cancelled: threading.Event,
                         *args: P.args, **kwargs: P.kwargs) -> None:
        try:
            recorded = await work(cancelled, *args, **kwargs)
        except asyncio.CancelledError:
            raise
        except (ProviderMissing, HostUnavailable) as missing:
            log.warning("%s; environment %s waits for it", missing, step_key[0])
            self._wake_at(step_key[0], _now() + PROVIDER_RECHECK)
            return
        except Exception:
            log.exception("step %s of environment %s failed; the sweep will try again", step_key[1], step_key[0])
            return
        finally:
            self._steps.pop(step_key, None)
        if recorded is None:
            self._failed_steps[step_key] = retry_at = _now() + self._failed_step_retry
            self._wake_at(step_key[0], retry_at)
            return
        self._failed_steps.pop(step_key, None)
        await self._drive_or_leave_to_sweep(step_key[0], recorded)

    async def _drive_or_leave_to_sweep(self, environment_id: UUID, known: Environment | None = None) -> None:
        """Drive from a task of our own, which nobody awaits: a failure is logged here or nowhere."""
        try:
            await self.drive(environment_id, known)
        except Exception:
            log.exception("could not drive environment %s; the sweep will try again", environment_id)

    def _forget(self, environment_id: UUID) -> None:
        """Drop what this process keeps of a removed environment, whose log has ended: a service
        that runs for months must not hold a mark for every environment it ever drove. Kept: its
        lock (a drive may wait on it now) and `_advanced_from`, so that an event of it delivered
        again, or a copy of it from before its removal handed to a drive late, is read afresh
        rather than advanced from."""
        self._newest_known.pop(environment_id, None)
        self._activity.pop(environment_id, None)
        if (timer := self._timers.pop(environment_id, None)) is not None:
            timer.cancel()
        for step_key in [key for key in self._failed_steps if key[0] == environment_id]:
            del self._failed_steps[step_key]

    def _wake_at(self, environment_id: UUID, when: datetime) -> None:
        if environment_id in self._timers:
            self._timers[environment_id].cancel()
        delay = max(0.0, (when - _now()).total_seconds())
        loop = asyncio.get_running_loop()
        self._timers[environment_id] = loop.call_later(
            delay, lambda: loop.create_task(self._drive_or_leave_to_sweep(environment_id))
        )

    def _pausable(self, env: Environment) -> PausableProvider | None:
        """The environment's provider, if it can suspend an idle resource (and one is recorded)."""
        provider = self._placer.registry.get(env.provider_id)
        if provider is None or env.resource is None or not is_pausable(provider):
            return None
        return provider

    async def _pause_if_idle(self, env: Environment, quiet_since: datetime, now: datetime) -> None:
        """Pause the environment if its provider says it has been idle long enough."""
        provider = self._pausable(env)
        if provider is None:
            return
        # Nothing seen since this process started: count from the last event.
        last_activity = self._activity.get(env.id, quiet_since)
        data_dir = str(self._placer.provider_dir(provider.id))
        if await asyncio.to_thread(provider.idle_pause_due, last_activity, now, data_dir):
            self._start(env, "pause", self._pause, env, provider)

    def _resume_on_activity(self, env: Environment, paused_at: datetime) -> None:
        provider = self._pausable(env)
        last_activity = self._activity.get(env.id)
        if provider is not None and last_activity is not None and last_activity > paused_at:
            self._start(env, "resume", self._resume, env, provider)

    async def _pause(self, cancelled: threading.Event, env: Environment,
                     provider: PausableProvider) -> Environment | None:
        assert env.resource is not None  # `_pausable` gave the provider for this environment's resource
        loop = asyncio.get_running_loop()

        def checkpoint(resource: dict[str, Any]) -> None:
            # Called by the provider mid-pause: its new handle is durable before it terminates anything.
            asyncio.run_coroutine_threadsafe(self._store.run(self._app.record_resource, env.id, resource), loop).result()

        self._transcript.line(str(env.id), "step", provider.id, "Pausing the idle environment")
        try:
            resource = await asyncio.to_thread(provider.pause, env.resource, checkpoint)
        except Exception as error:
            self._transcript.line(str(env.id), "output", provider.id, f"pause failed: {error}")
            return None
        return await self._store.run(self._app.record_paused, env.id, resource, _now())

    async def _resume(self, cancelled: threading.Event, env: Environment,
                      provider: PausableProvider) -> Environment | None:
        assert env.resource is not None  # `_pausable` gave the provider for this environment's resource
        self._transcript.line(str(env.id), "step", provider.id, "Resuming the environment")
        try:
            resource = await asyncio.to_thread(provider.resume, env.resource)
        except Exception as error:
            self._transcript.line(str(env.id), "output", provider.id, f"resume failed: {error}")
            return None
        return await self._store.run(self._app.record_resumed, env.id, resource)

    async def _retry_transient(self, env: Environment) -> None:
        path_key, claimed_path = await self._placer.next_attempt(
            env.provider_id, env.origin_thread_id, env.attempt, env.host_id, env.project_path, env.inputs,
            env.path_key,
        )
        self._transcript.line(str(env.id), "step", "core", f"Retrying after a transient failure: {env.status_message}")
        await self._record(env, self._app.retry, path_key, claimed_path)

    async def _stop_create(self, env: Environment, attempt: int, now: datetime) -> None:
        """Cancellation waits for a running create to settle before anything is removed."""
        running = self._steps.get((env.id, f"create.{attempt}"))
        if running is not None:
            running.cancelled.set()
            return
        await self._record(env, self._app.start_removal, now)

    # -- the long steps ------------------------------------------------------------------------

    async def _create(self, cancelled: threading.Event, env: Environment) -> Environment:
        provider = self._placer.registry.get(env.provider_id)
        if provider is None:
            # An unregistered provider cancels the creates it had pending; their cleanup waits for it.
            message = f"the environment provider {env.provider_id!r} is not registered"
            return await self._store.run(self._app.record_create_failed, env.id, env.attempt, "terminal", message)
        self._transcript.line(str(env.id), "step", "core", f"Preparing {provider.display_name} (attempt {env.attempt})")
        context = self._placer.context(provider, env.host_id, env.project_path, _typed_inputs(provider, env.inputs))
        Path(context.data_dir).mkdir(parents=True, exist_ok=True)
        create_context = CreateContext(
            host_id=context.host_id, project_path=context.project_path, inputs=context.inputs,
            data_dir=context.data_dir, thread_id=env.thread_ids[0] if env.thread_ids else "",
            path_key=env.path_key, attempt=env.attempt,
            previous=Previous(env.attempt - 1, env.path, env.resource) if env.attempt > 1 else None,
            report=_TranscriptReporter(self._transcript, str(env.id), provider.id), cancelled=cancelled,
        )
        result = await asyncio.to_thread(_call_create, provider, create_context)
        crash_point("create-returned")
        if isinstance(result, Created):
            if result.empty and result.owns_path:
                # A fact of this creation, said whatever the save below then records (an archive
                # meanwhile leads to removal instead of a skip).
                self._transcript.line(str(env.id), "step", "setup", MADE_EMPTY_REASON)
            created = await self._store.run(
                self._app.record_created, env.id, env.attempt, canonical_path(result.path),
                result.owns_path, result.merge_base_branch, result.resource, result.empty,
            )
            crash_point("created-recorded")
            return created
        self._transcript.line(str(env.id), "output", provider.id, result.message)
        return await self._store.run(self._app.record_create_failed, env.id, env.attempt, result.failure, result.message)

    async def _run_setup(self, cancelled: threading.Event, env: Environment, operation_id: str) -> Environment:
        """`operation_id` is the step's: the setup operation `env` recorded."""
        outcome = await self._run_hook(env, operation_id, "setup")
        crash_point("setup-finished")
        what = f"recording the setup outcome of environment {env.id}"
        if outcome.status == "skipped":  # the host found no script in the workspace
            return await self._save_outcome(what, self._app.record_setup_skipped, env.id, operation_id,
                                            outcome.message or f"no {SCRIPT_NAMES['setup']}")
        return await self._save_outcome(what, self._app.record_setup_outcome, env.id, operation_id,
                                        outcome.status == "succeeded", outcome.message)

    async def _run_teardown(self, cancelled: threading.Event, env: Environment, operation_id: str) -> Environment:
        """`operation_id` is the step's: the teardown operation `env` recorded."""
        outcome = await self._run_hook(env, operation_id, "teardown")
        crash_point("teardown-finished")
        what = f"recording the teardown outcome of environment {env.id}"
        if outcome.status == "skipped":  # the host found no script in the workspace
            return await self._save_outcome(what, self._app.record_teardown_skipped, env.id, operation_id,
                                            outcome.message or f"no {SCRIPT_NAMES['teardown']}")
        return await self._save_outcome(what, self._app.record_teardown_outcome, env.id, operation_id,
                                        outcome.status, outcome.message)

    async def _save_outcome(self, what: str, command: Callable[P, Environment], *args: P.args,
                            **kwargs: P.kwargs) -> Environment:
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
        environment_id = str(env.id)
        script = SCRIPT_NAMES[kind]
        self._transcript.line(environment_id, "step", kind, f"Running {script}")
        assert env.path is not None  # hooks run only in a workspace its provider created (and owns)
        outcome = await self._hooks.run(env.host_id, environment_id, operation_id, kind, env.path,
                                        env.current_hook(operation_id))
        verdict = {"succeeded": "finished", "skipped": "skipped: the workspace has none"}.get(
            outcome.status, f"{outcome.status}: {outcome.message}")
        self._transcript.line(environment_id, "step", kind, f"{script} {verdict}")
        return outcome

    async def _call_provider_remove(self, env: Environment, cancelled: threading.Event) -> RemoveResult:
        """At most CLEANUPS_AT_ONCE removals run, one per host, so a stuck host blocks only itself."""
        provider = self._placer.registry.get(env.provider_id)
        if provider is None:
            raise ProviderMissing(f"the environment provider {env.provider_id!r} is not registered")
        host_slot = self._host_slots.setdefault(env.host_id, asyncio.Semaphore(1))
        async with host_slot, self._cleanup_slots:
            context = RemoveContext(
                host_id=env.host_id, data_dir=str(self._placer.provider_dir(provider.id)),
                project_path=env.project_path, inputs=_typed_inputs(provider, env.inputs),
                path=env.path, path_key=env.path_key, attempt=env.attempt, resource=env.resource,
                report=_TranscriptReporter(self._transcript, str(env.id), provider.id), cancelled=cancelled,
            )
            return await asyncio.to_thread(_call_remove, provider, context)

    async def _clean_attempt(self, cancelled: threading.Event, env: Environment) -> Environment | None:
        result = await self._call_provider_remove(env, cancelled)
        if isinstance(result, Removed):
            return await self._store.run(self._app.record_attempt_cleaned, env.id, env.attempt)
        self._transcript.line(str(env.id), "output", env.provider_id, f"cleanup failed: {result.message}")
        return None

    async def _remove(self, cancelled: threading.Event, env: Environment) -> Environment:
        result = await self._call_provider_remove(env, cancelled)
        crash_point("remove-returned")
        if isinstance(result, Removed):
            return await self._store.run(self._app.record_removed, env.id, env.removal_attempt)
        self._transcript.line(str(env.id), "output", env.provider_id, f"removal failed: {result.message}")
        return await self._store.run(
            self._app.record_remove_failed, env.id, env.removal_attempt, result.message, _now() + REMOVE_RETRY
        )


def _typed_inputs(provider: EnvironmentProvider, inputs: object) -> object:
    return None if provider.inputs_type is None else msgspec.convert(inputs, provider.inputs_type)


def _call_create(provider: EnvironmentProvider, context: CreateContext) -> CreateResult:
    """A provider that raises or answers nonsense fails this environment, never the service."""
    try:
        result = provider.create(context)
    except Exception as error:
        return CreateFailed("terminal", f"the {provider.id!r} provider failed: {error}")
    if not isinstance(result, (Created, CreateFailed)):
        return CreateFailed("terminal", f"the {provider.id!r} provider returned an invalid create result")
    return result


def _call_remove(provider: EnvironmentProvider, context: RemoveContext) -> RemoveResult:
    try:
        result = provider.remove(context)
    except Exception as error:
        return RemoveFailed(f"the {provider.id!r} provider failed to remove: {error}")
    if not isinstance(result, (Removed, RemoveFailed)):
        return RemoveFailed(f"the {provider.id!r} provider returned an invalid remove result")
    return result
