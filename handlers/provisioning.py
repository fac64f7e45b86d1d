"""Drives each environment on from whatever state its log says it is in.

`drive(environment_id)` reads the aggregate (or takes it as a command just left it), asks it for
its next step (`Environment.next_step`: create, setup hook, removal, teardown hook, provider
remove, a timer...) and executes that step; what comes next is never decided here. Long steps
(host_steps.py) run as supervised tasks off the handler: the step is recorded first (an event naming its attempt
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
from datetime import UTC, datetime, timedelta
from typing import Concatenate, ParamSpec, assert_never
from uuid import UUID

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import UnknownEnvironment
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.domain.steps import (
    BindMember,
    CancelSetup,
    CleanAttempt,
    PauseWhenIdle,
    Remove,
    Resume,
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
from bb_environments.handlers.host_steps import HostSteps
from bb_environments.handlers.placement import Placer
from bb_environments.handlers.ports import (
    ActivityElsewhere,
    Everything,
    Hosts,
    HostUnavailable,
    NoOtherReplica,
    Outcomes,
    OutcomesUntold,
    ProviderMissing,
    Share,
    Transcript,
)
from bb_environments.handlers.store import Store
from bb_environments.providers.workspace_messages import ResourceRequest

log = logging.getLogger(__name__)

P = ParamSpec("P")

PROVIDER_RECHECK = timedelta(seconds=30)
HOST_RECHECK = timedelta(seconds=5)
"""How soon a step that waits for its host's agent asks again: well within the 30 s in which an
environment goes on after its agent is back (SPEC 7.1)."""
FAILED_STEP_RETRY = timedelta(seconds=30)
"""How long a step that failed without recording anything (a cleanup, a pause, a resume) waits
before it runs again: the environment still asks for it, so at once would be a busy loop."""

_Work = Callable[Concatenate[threading.Event, P], Awaitable[Environment | None]]
"""A long step: it returns the environment as the event recording its outcome left it, or None
when it failed and recorded nothing (it runs again after FAILED_STEP_RETRY)."""


def _now() -> datetime:
    return datetime.now(UTC)


async def _nobody_places(thread_id: str) -> None:
    log.warning("thread %s waits for its environment until the service starts again", thread_id)


@dataclass
class _Step:
    task: asyncio.Task[None]
    cancelled: threading.Event


class Provisioner:
    def __init__(
        self,
        store: Store,
        placer: Placer,
        hosts: Hosts,
        transcript: Transcript,
        transient_retry_delay: timedelta = timedelta(seconds=30),
        failed_step_retry: timedelta = FAILED_STEP_RETRY,
        share: Share = Everything(),
        activity_elsewhere: ActivityElsewhere = NoOtherReplica(),
        measure_soon: Callable[[UUID], None] = lambda environment_id: None,
    ) -> None:
        """`share`: the environments this replica drives; a drive of any other does nothing, and
        activity on one is told to its driver through `activity_elsewhere`. `measure_soon`: told
        of each environment whose setup has settled (handlers/disk_usage.py)."""
        self._store = store
        self._share = share
        self._activity_elsewhere = activity_elsewhere
        self._outcomes: Outcomes = OutcomesUntold()
        self._removals_waiting: set[UUID] = set()  # for their outcomes to be out (see _outcomes_out)
        self._app = store.app
        self._placer = placer
        self._hosts = hosts
        self._transcript = transcript
        self._measure_soon = measure_soon
        self._on_host = HostSteps(store, hosts, transcript, measure_soon)
        self._locks: dict[UUID, asyncio.Lock] = {}
        self._steps: dict[tuple[UUID, str], _Step] = {}
        self._timers: dict[UUID, asyncio.TimerHandle] = {}
        self._failed_steps: dict[tuple[UUID, str], datetime] = {}  # step -> when it may run again
        self._transient_retry_delay = transient_retry_delay
        self._failed_step_retry = failed_step_retry
        self._activity: dict[UUID, datetime] = {}
        self._advanced_from: dict[UUID, int] = {}
        self._newest_known: dict[UUID, int] = {}  # see drive
        self._stopped = False
        self.place_again: Callable[[str], Awaitable[object]] = _nobody_places
        """Places a thread whose pool member could not be bound (the thread handlers' first message)."""

    def wait_for_outcomes(self, outcomes: Outcomes) -> None:
        """Start an environment's removal only once `outcomes` says the placement outcomes of its
        life so far are published: set where the core runs a follower of the log that publishes them."""
        self._outcomes = outcomes

    @property
    def busy(self) -> bool:
        """Some long step is running (tests wait for this to settle)."""
        return bool(self._steps)

    async def note_activity(self, env: Environment) -> Environment:
        """A thread of the environment did something (a message): it is not idle, and the
        environment as it is left. A paused one has its resume asked in the log, for whichever
        replica drives it now or after a failover or a restart (the log's follower there drives
        it on the event); otherwise the activity is kept by the replica that drives it, which
        decides its pause (lost in a failover, it costs an early pause: the next message resumes)."""
        if env.paused_at is not None:
            return await self._store.run(self._app.request_resume, env.id)
        if self._share.drives(env.id):
            self._activity[env.id] = _now()
        else:
            await self._activity_elsewhere.tell_driver(env.id)
        return env

    async def heard_activity(self, environment_id: UUID) -> None:
        """Another replica heard a thread's activity on the environment: counted, and the
        environment driven (resumed if paused), if this replica drives it."""
        if not self._share.drives(environment_id):
            return
        self._activity[environment_id] = _now()
        try:
            await self.drive(environment_id)
        except UnknownEnvironment:
            del self._activity[environment_id]
            raise

    async def drive(self, environment_id: UUID, known: Environment | None = None) -> None:
        """`known`: the environment as a command of this process has just left it, advanced from
        without a trip to the writer to read it again. Read again all the same when it may be out
        of date: this process advanced from it or a later version already, or a later version was
        handed to a drive that waits for the lock meanwhile (a step that ended while this drive
        waited: advancing from before its outcome would start that step again)."""
        if not self._share.drives(environment_id):
            return
        if known is not None:
            self._newest_known[environment_id] = max(known.version, self._newest_known.get(environment_id, 0))
        lock = self._locks.setdefault(environment_id, asyncio.Lock())
        async with lock:
            # `_newest_known` may have been forgotten meanwhile (the environment was removed): then
            # `_advanced_from`, which is kept, sends this drive to read it.
            if (
                known is None
                or self._advanced_from.get(environment_id, 0) >= known.version
                or self._newest_known.get(environment_id, 0) > known.version
            ):
                known = await self._store.run(self._app.environment, environment_id)
            await self._advance(known)

    async def catch_up(self, environment_id: UUID, version: int) -> None:
        """Drive an environment for an event from the log, unless this process already advanced
        from that version (it usually recorded the event itself a moment ago) and its removal does
        not wait for the outcomes that the log's follower has published now."""
        if self._advanced_from.get(environment_id, 0) < version or environment_id in self._removals_waiting:
            self._removals_waiting.discard(environment_id)
            await self.drive(environment_id)

    async def sweep(self) -> None:
        """Drive every environment whose log has not ended: recovery, deadlines, retries."""
        for environment_id in await self._store.run(self._app.unfinished_environment_ids):
            try:
                await self.drive(environment_id)
            except Exception:
                log.exception("sweep could not drive environment %s", environment_id)

    def let_go(self) -> None:
        """Stop waiting on the steps and timers of environments this replica no longer drives: the
        replica that drives them now reads where they stand from the log, as after a crash (a step
        running on a host goes on there, and its outcome is recorded under its operation once)."""
        for environment_id in [e for e in self._timers if not self._share.drives(e)]:
            self._timers.pop(environment_id).cancel()
        for step_key, step in list(self._steps.items()):
            if not self._share.drives(step_key[0]):
                step.task.cancel()

    async def stop(self) -> None:
        # A drive still under way (a timer's that had fired, an answer's) starts no step and sets
        # no timer from now on: what it would have started is the next start's sweep's, as after a crash.
        self._stopped = True
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
                self._start(env, f"create.{attempt}", self._on_host.create, env)
            case StopCreate(attempt):
                await self._stop_create(env, attempt, now)
            case StartSetup():
                await self._record(env, self._app.start_setup)
            case SkipSetup(reason):
                await self._record(env, self._app.skip_setup, reason)
                self._measure_soon(env.id)
            case BindMember():
                self._start(env, "bind", self._bind, env)
            case RunSetup(operation_id):
                self._start(env, operation_id, self._on_host.run_setup, env, operation_id)
            case CancelSetup(operation_id):
                self._start(
                    env, operation_id, self._on_host.run_setup, env, operation_id
                )  # its outcome is still recorded
                try:
                    await self._hosts.host(env.host_id).cancel_hook(env.host_id, operation_id)
                except HostUnavailable as unavailable:
                    # Asked again at the next drive (the sweep's at the latest); an outage of the
                    # bus is reported once, by the bus's health, not here at every sweep.
                    log.debug("could not stop the setup of environment %s yet: %s", env.id, unavailable)
            case StartRemoval() | RetryRemoval():
                if await self._outcomes_out(env):
                    await self._record(env, self._app.start_removal, now)
            case CleanAttempt(attempt):
                self._start(env, f"cleanup.{attempt}", self._on_host.clean_attempt, env)
            case RetryTransient():
                await self._retry_transient(env)
            case WakeAt(when):
                self._wake_at(env.id, when)
            case PauseWhenIdle(quiet_since):
                await self._pause_if_idle(env, quiet_since, now)
            case Resume():
                self._resume(env)
            case ResumeOnActivity(paused_at):
                self._resume_on_activity(env, paused_at)
            case StartTeardown():
                await self._record(env, self._app.start_teardown)
            case SkipTeardown(reason):
                await self._record(env, self._app.skip_teardown, reason)
            case RunTeardown(operation_id):
                self._start(env, operation_id, self._on_host.run_teardown, env, operation_id)
            case Remove(removal_attempt):
                self._start(env, f"remove.{removal_attempt}", self._on_host.remove, env)
            case Settled():
                if env.status == EnvironmentStatus.REMOVED:
                    self._forget(env.id)
            case unexpected:
                assert_never(unexpected)

    async def _outcomes_out(self, env: Environment) -> bool:
        """Whether the placement outcomes of the environment's life so far are published: until
        they are, its removal waits (the log's follower drives it on when they are), so that a
        thread never hears `ready` after its environment's `removed` (SPEC 8.1)."""
        if await self._outcomes.out_for(env.id, env.version):
            return True
        self._removals_waiting.add(env.id)
        return False

    async def _record(
        self, env: Environment, command: Callable[Concatenate[UUID, P], object], *args: P.args, **kwargs: P.kwargs
    ) -> None:
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
        if self._stopped or step_key in self._steps:
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

    async def _supervise(
        self, step_key: tuple[UUID, str], work: _Work[P], cancelled: threading.Event, *args: P.args, **kwargs: P.kwargs
    ) -> None:
        try:
            recorded = await work(cancelled, *args, **kwargs)
        except asyncio.CancelledError:
            raise
        except ProviderMissing as missing:
            log.warning("%s; environment %s waits for it", missing, step_key[0])
            self._wake_at(step_key[0], _now() + PROVIDER_RECHECK)
            return
        except HostUnavailable as away:
            await self._note_host_awaited(step_key[0], str(away))
            self._wake_at(step_key[0], _now() + HOST_RECHECK)
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

    async def _note_host_awaited(self, environment_id: UUID, message: str) -> None:
        """Say in the environment's status that it waits for its host (once per sentence)."""
        try:
            await self._store.run(self._app.note_host_awaited, environment_id, message)
        except Exception:
            log.exception("could not note that environment %s waits for its host", environment_id)

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
        if self._stopped:
            return
        if environment_id in self._timers:
            self._timers[environment_id].cancel()
        delay = max(0.0, (when - _now()).total_seconds())
        loop = asyncio.get_running_loop()
        self._timers[environment_id] = loop.call_later(
            delay, lambda: loop.create_task(self._drive_or_leave_to_sweep(environment_id))
        )

    def _pausable(self, env: Environment) -> ResourceRequest | None:
        """The environment's resource to pause or resume, if its provider can suspend it."""
        profile = self._hosts.profiles().get(env.provider_id)
        if profile is None or env.resource is None or not profile.pausable:
            return None
        return ResourceRequest(str(env.id), env.host_id, env.provider_id, env.resource)

    async def _pause_if_idle(self, env: Environment, quiet_since: datetime, now: datetime) -> None:
        """Pause the environment if its provider says it has been idle long enough."""
        request = self._pausable(env)
        if request is None:
            return
        # Nothing seen since this process started: count from the last event.
        last_activity = self._activity.get(env.id, quiet_since)
        if await self._hosts.host(env.host_id, env.provider_id).idle_pause_due(
            env.host_id, env.provider_id, last_activity, now
        ):
            self._start(env, "pause", self._on_host.pause, env, request, now)

    def _resume_on_activity(self, env: Environment, paused_at: datetime) -> None:
        """A message that came while the pause ran was activity after `paused_at`."""
        last_activity = self._activity.get(env.id)
        if last_activity is not None and last_activity > paused_at:
            self._resume(env)

    def _resume(self, env: Environment) -> None:
        request = self._pausable(env)
        if request is not None:
            self._start(env, "resume", self._on_host.resume, env, request)

    async def _bind(self, cancelled: threading.Event, env: Environment) -> Environment:
        """Bind the member; when that failed, the thread it left is placed again at once."""
        bound = await self._on_host.bind(cancelled, env)
        if bound.cancelled and bound.origin_thread_id not in bound.thread_ids:
            await self.place_again(bound.origin_thread_id)
        return bound

    async def _retry_transient(self, env: Environment) -> None:
        path_key, claimed_path = await self._placer.next_attempt(
            env.provider_id, env.origin_thread_id, env.attempt, env.host_id, env.project_path, env.inputs, env.path_key
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
