"""Running a workspace's setup/teardown hook at most once per operation id.

Each hook runs under a supervisor (see supervisor), a process in its own session that outlives
this service and writes the script's outcome into the operation's durable record. So after a
restart a hook still running is joined and its real outcome read back; only when the supervisor
itself has died is the outcome unknown ("interrupted").

Supervisors are forked by a launcher, which this runner starts and asks for each one (see
launcher_client). The runner learns that a supervisor it started is done from a pipe the
supervisor closes right after its last record write, and that it died from its pidfd; no polling
(see supervisor_watch).

A disk that refuses a record write for lack of space delays a hook, never loses or repeats it.
The supervisor holds an outcome it cannot write and hands it over when asked (see supervisor),
so a finished hook's outcome reaches the caller while the disk is still full; a write of this
process's own (the adopting record, an orphan's "interrupted") that the disk refuses is retried,
with backoff, by running the operation again: the records make that repeated run join or replay
the first.

This process assumes it is the only service using its records directory: a record whose
supervisor was never adopted (see supervisor) is only waited on while this process's own run
of that operation is in flight.

A hook whose script is missing runs nothing and leaves no record: its `skipped` is kept in memory
(the last SKIPS_REMEMBERED of them), so the same operation asked again answers the same while this
process lives; asked again after a restart it is decided again, and still runs at most once.

Output lines are delivered through `on_output` at most once per process, each with its byte
offset in the operation's log (see output_delivery).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, cast

from bb_environments.domain.hook_operations import SCRIPT_NAMES, HookKind, HookOutcome
from bb_environments.hooks.launcher_client import LauncherClient
from bb_environments.hooks.output_delivery import OutputDelivery, read_from
from bb_environments.hooks.output_delivery import OutputSink as OutputSink  # `run`'s callers name it from here
from bb_environments.hooks.output_log import DEFAULT_OUTPUT_MAX_BYTES
from bb_environments.hooks.protocol import ADOPTED_SIGNAL, SupervisorRequest
from bb_environments.hooks.records import (
    OUT_OF_SPACE,
    HookIdentityMismatch,
    HookRecord,
    HookRecords,
    SyncLevel,
    now_iso,
)
from bb_environments.hooks.stopping import POLL_S, CancelResult, SupervisorStopping
from bb_environments.hooks.supervisor_watch import (
    SupervisorHandle,
    SupervisorWatch,
    open_supervisor_pidfd,
    supervisor_alive,
)
from bb_environments.providers.git_commands import take_owed_post_checkout
from bb_environments.providers.host.backoff import Backoff
from bb_environments.providers.host.containment import MARKER, Containment
from bb_environments.providers.host.withheld import hook_environment
from bb_environments.providers.host.workspace_user import WorkspaceUser

log = logging.getLogger(__name__)

SKIPS_REMEMBERED = 4096

HookBegin = Literal["started", "rejoined", "replayed"]
"""How a run met its operation: it started the hook, joined one still running (started by an
earlier process), or found it finished and replays its log."""
BeginSink = Callable[[HookBegin], None]
"""Told once per run, before the first line of output, how the run met its operation."""


CANCELLED_BEFORE_START = HookOutcome("cancelled", None, "cancelled before it started")


_Begun = asyncio.Future[tuple[HookRecord | None, bool, SupervisorHandle | None]]
"""The first step of an attempt (`HookRunner._begin`), on a worker thread."""


@dataclass
class _InFlight:
    kind: str
    workspace: str
    environment_id: str | None
    variables: Mapping[str, str]
    secrets: Mapping[str, str]
    # The current attempt's first step until the run's task has its result (then None): a task
    # that ends without it (cancelled, even before its first step, by the loop shutting down)
    # leaves the supervisor that step started for `_close_untaken` to close.
    begun: _Begun | None
    on_begin: BeginSink | None = None
    task: asyncio.Task[HookOutcome] = field(init=False)


class HookRunner:
    def __init__(
        self,
        records_dir: Path,
        timeout_s: float,
        sync: SyncLevel = "normal",
        output_max_bytes: int = DEFAULT_OUTPUT_MAX_BYTES,
        *,
        containment: Containment | None = None,
        run_as: WorkspaceUser | None = None,
        git_hooks: bool = False,
        transcript_lines_kept: int | None = None,
    ) -> None:
        """`sync`: how the records survive the machine going down (see records.SyncLevel);
        `output_max_bytes`: how much of a hook's output its log keeps (see output_log);
        `containment` keeps what each environment's hooks start within its removal's reach;
        `run_as` is the user hooks run as (BB_WORKSPACE_USER), else this process's; `git_hooks`
        (BB_GIT_HOOKS=run): a setup first runs the git hook its workspace's checkout owes;
        `transcript_lines_kept`: how much of a backlog of output is delivered (see output_delivery)."""
        self._records = HookRecords(records_dir, sync)
        self._timeout_s = timeout_s
        self._output_max_bytes = output_max_bytes
        self._containment = containment
        self._run_as = run_as
        self._git_hooks = git_hooks
        self._in_flight: dict[str, _InFlight] = {}
        self._delivered = OutputDelivery(transcript_lines_kept)
        self._stopping = SupervisorStopping(self._records)
        self._skipped: OrderedDict[str, HookRecord] = OrderedDict()
        self._launcher = LauncherClient()
        weakref.finalize(self, self._launcher.close)

    async def prepare(self) -> None:
        """Start the launcher now rather than on the first hook, which would wait for its start-up."""
        await asyncio.to_thread(self._launcher.ensure_started)

    def close(self) -> None:
        """Stop the launcher; running hooks are not affected, and a later run starts a new one."""
        self._launcher.close()

    def status(self, operation_id: str) -> HookRecord | None:
        """The operation's record; finished, if its supervisor holds an outcome it could not write."""
        record = self._records.read(operation_id)
        if record is not None and record.finished_at is None:
            return self._records.held_outcome(record) or record
        return record or self._skipped.get(operation_id)

    def output_page(self, operation_id: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        """Up to `limit` bytes of the hook's output log from `offset`, and the offset after them;
        None when this host keeps no record of the operation. Blocking."""
        if self._records.read(operation_id) is None:
            return None
        try:
            with open(self._records.log_path(operation_id), "rb") as log:
                log.seek(offset)
                data = log.read(limit)
        except FileNotFoundError:
            data = b""
        return data, offset + len(data)

    def settled_before(self, cutoff: datetime) -> list[str]:
        """Operations whose hook finished (or was cancelled before it started) before `cutoff`. Blocking."""
        return self._records.settled_before(cutoff)

    def delete_abandoned_writes(self, cutoff: datetime) -> None:
        """Record writes a crash cut short before `cutoff` leave nothing behind. Blocking."""
        self._records.delete_abandoned_writes(cutoff)

    async def forget(self, operation_ids: Iterable[str]) -> list[str]:
        """Delete the records and logs of settled operations, except those a run here still follows.

        Only for operations nobody will run, join or replay again: a run asked for afterwards
        would start the hook anew. Returns the operations forgotten.
        """
        idle = [operation_id for operation_id in operation_ids if operation_id not in self._in_flight]
        await asyncio.to_thread(self._records.delete, idle)
        for operation_id in idle:
            self._delivered.forget(operation_id)
            self._stopping.forget(operation_id)
            self._skipped.pop(operation_id, None)
        return idle

    async def run(
        self,
        operation_id: str,
        kind: str,
        workspace: Path,
        on_output: OutputSink,
        environment_id: str | None = None,
        variables: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> HookOutcome:
        """Run the hook once; a repeated or concurrent call for the same operation gets its outcome.

        A concurrent second call waits for the first one's outcome; only the first call's
        `on_output` receives the lines. The hook of an `environment_id` is contained with its
        environment's others. `variables` are those the core gives the hook on purpose
        (RecordedHook.given_variables); no other variable of the service's reaches it. `secrets`,
        the project's (SPEC 11), reach it as variables too, and its log shows each value as `***`.
        """
        return await self.start(
            operation_id, kind, workspace, on_output, environment_id, variables=variables, secrets=secrets
        )

    def start(
        self,
        operation_id: str,
        kind: str,
        workspace: Path,
        on_output: OutputSink,
        environment_id: str | None = None,
        on_begin: BeginSink | None = None,
        variables: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> asyncio.Future[HookOutcome]:
        """`run`, begun before this returns: a new operation's first step (reading its record and
        starting its supervisor) is already with a worker thread, rather than waiting for the
        event loop to step a task of its own and then hand the step over. `on_begin` hears how
        the run met the operation (not for a hook that had no script, or was cancelled)."""
        if kind not in SCRIPT_NAMES:
            raise ValueError(f"unknown hook kind {kind!r}")
        workspace = Path(workspace)
        if (skipped := self._skipped.get(operation_id)) is not None:
            _check_identity(skipped, kind, workspace)
            answered: asyncio.Future[HookOutcome] = asyncio.get_running_loop().create_future()
            answered.set_result(_outcome(skipped))
            return answered
        in_flight = self._in_flight.get(operation_id)
        if in_flight is None:
            in_flight = _InFlight(
                kind, str(workspace), environment_id, dict(variables or {}), dict(secrets or {}), None, on_begin
            )
            in_flight.begun = self._begin_soon(operation_id, in_flight)
            in_flight.task = asyncio.ensure_future(self._run_until_recorded(operation_id, on_output, in_flight))
            self._in_flight[operation_id] = in_flight
            in_flight.task.add_done_callback(lambda _: self._end_in_flight(operation_id, in_flight))
        elif (in_flight.kind, in_flight.workspace) != (kind, str(workspace)):
            raise HookIdentityMismatch(f"operation {operation_id!r} is already running another hook")
        # Shielded: a caller that stops waiting must not stop the hook's bookkeeping midway.
        return asyncio.shield(in_flight.task)

    def _begin_soon(self, operation_id: str, hook: _InFlight) -> _Begun:
        return asyncio.get_running_loop().run_in_executor(None, self._begin, operation_id, hook)

    def _end_in_flight(self, operation_id: str, in_flight: _InFlight) -> None:
        self._in_flight.pop(operation_id, None)
        if in_flight.begun is not None:
            _close_untaken(in_flight.begun)

    async def cancel(self, operation_id: str) -> CancelResult:
        """Make sure the hook never starts, or stop it; returns what there was to stop."""
        await asyncio.to_thread(self._records.tombstone, operation_id)
        record = await self._record_once_adopted(operation_id)
        return await self._stopping.stop(record)

    async def _run_until_recorded(self, operation_id: str, on_output: OutputSink, in_flight: _InFlight) -> HookOutcome:
        """Each attempt starts with its first step under way (`in_flight.begun`); the first one's
        was begun by `start`, a later one's (its predecessor's ran out of disk) begins anew here."""
        backoff = Backoff(log, f"recording hook operation {operation_id!r}")
        while True:
            try:
                outcome = await self._run_once(on_output, in_flight)
            except OSError as error:
                if error.errno not in OUT_OF_SPACE:
                    raise
                await asyncio.sleep(backoff.failed(error))
                in_flight.begun = self._begin_soon(operation_id, in_flight)
                continue
            backoff.succeeded()
            return outcome

    async def _run_once(self, on_output: OutputSink, in_flight: _InFlight) -> HookOutcome:
        begun = in_flight.begun
        assert begun is not None  # see _run_until_recorded
        # Shielded: cancelling this task must not cancel the step, whose result would then be lost
        # with the supervisor it started; `_end_in_flight` closes that supervisor instead.
        record, tombstoned, supervisor = await asyncio.shield(begun)
        in_flight.begun = None  # ours now: `_follow` closes the supervisor
        if tombstoned:
            return await self._settle_cancelled(record)
        assert record is not None
        if record.outcome == "skipped":  # no script ran, so there is no log: nothing to follow
            self._remember_skipped(record)
            return _outcome(record)
        if in_flight.on_begin is not None:  # once: a later attempt (after a full disk) finds its own record
            in_flight.on_begin(
                "started" if supervisor is not None else "rejoined" if record.finished_at is None else "replayed"
            )
            in_flight.on_begin = None
        return _outcome(await self._follow(record, on_output, supervisor))

    def _remember_skipped(self, record: HookRecord) -> None:
        self._skipped[record.operation_id] = record
        if len(self._skipped) > SKIPS_REMEMBERED:
            self._skipped.popitem(last=False)

    def _begin(self, operation_id: str, hook: _InFlight) -> tuple[HookRecord | None, bool, SupervisorHandle | None]:
        """The operation's record and tombstone; if it has neither, the hook is started. Blocking."""
        record = self._records.read(operation_id)
        if record is not None:
            _check_identity(record, hook.kind, Path(hook.workspace))
        tombstoned = self._records.is_tombstoned(operation_id)
        if record is not None or tombstoned:
            return record, tombstoned, None
        record, supervisor = self._start(operation_id, hook)
        return record, False, supervisor

    async def _settle_cancelled(self, record: HookRecord | None) -> HookOutcome:
        """A tombstoned operation: stop whatever a cancel interrupted by a crash left running."""
        if record is None:
            return CANCELLED_BEFORE_START
        await self._stopping.stop(record)
        settled = await asyncio.to_thread(self._records.read, record.operation_id)
        if settled is not None and settled.outcome == "cancelled":
            return _outcome(settled)
        return HookOutcome("cancelled", None, "the operation was cancelled")

    def _start(self, operation_id: str, hook: _InFlight) -> tuple[HookRecord, SupervisorHandle | None]:
        """Start a supervisor and write the fresh record adopting it; a missing script is skipped,
        with a record that is not written (see the module).

        Blocking: runs in a worker thread.
        """
        kind, workspace, environment_id = cast(HookKind, hook.kind), Path(hook.workspace), hook.environment_id
        script = workspace / SCRIPT_NAMES[kind]
        record = HookRecord(
            operation_id=operation_id, kind=kind, workspace=str(workspace), script=str(script), started_at=now_iso()
        )
        git_hook = None
        if self._git_hooks and kind == "setup" and environment_id is not None:
            git_hook = take_owed_post_checkout(workspace, environment_id)
        if git_hook is None and not script.is_file():
            record.finished_at = record.started_at
            record.outcome = "skipped"
            record.message = f"no {script.name}"
            return record, None
        # The variables the core gives come last: a secret never takes BB_ENVIRONMENT_ID's place.
        environment = hook_environment(os.environ, {**hook.secrets, **hook.variables})
        cgroups: list[str] = []
        if environment_id is not None:
            # What the fallback containment finds the environment's processes by, whoever runs the hook.
            environment[MARKER] = environment_id
            if self._containment is not None:
                cgroups = self._containment.prepare(environment_id)
        supervisor = self._launcher.start_supervisor(
            SupervisorRequest(
                str(self._records.directory),
                operation_id,
                repr(self._timeout_s),
                self._records.sync,
                environment,
                str(self._output_max_bytes),
                cgroups,
                self._run_as,
                git_hook,
                sorted(hook.secrets),
            )
        )
        try:
            # Adoption: the supervisor waits for its own identity in the record before it starts.
            # The record is first written here: until then no script can have started, so a crash
            # before this write leaves nothing that ran.
            record.supervisor_pid = supervisor.pid
            record.supervisor_started_at = supervisor.started_at
            self._records.write(record)
            try:
                signal.pidfd_send_signal(supervisor.pidfd, ADOPTED_SIGNAL)
            except ProcessLookupError:
                pass
        except BaseException:
            supervisor.close()
            raise
        return record, supervisor

    async def _follow(
        self, record: HookRecord, on_output: OutputSink, supervisor: SupervisorHandle | None = None
    ) -> HookRecord:
        """Deliver the log as it grows until the record is finished.

        `supervisor` (ours to close) is the one this process started; for a record found here it
        is looked up. The supervisor's exit (or, for one we started, its notice that it wrote its
        last record) ends the wait at once; only if no pidfd can be had for it is its liveness
        polled.
        """
        operation_id = record.operation_id
        watch: SupervisorWatch | None = None
        try:
            if supervisor is None and record.finished_at is None:
                pidfd = await asyncio.to_thread(open_supervisor_pidfd, record)
                if pidfd is not None:
                    supervisor = SupervisorHandle(record.supervisor_pid or 0, record.supervisor_started_at, pidfd)
            if supervisor is not None:
                watch, supervisor = SupervisorWatch(supervisor), None
                if record.finished_at is None and watch.fresh:
                    # Just started: nothing to read before it has had a moment.
                    await watch.wait(POLL_S)
            while True:
                exited = watch is not None and watch.exited
                offset = self._delivered.offset(operation_id)
                record, data = await asyncio.to_thread(self._snapshot, operation_id, offset)
                finished = record.finished_at is not None
                await self._delivered.deliver(operation_id, data, offset, on_output, complete=finished)
                if finished:
                    return record
                if exited:
                    break  # read after the supervisor exited, and unfinished: it died
                if watch is not None:
                    await watch.wait(POLL_S)
                elif not await asyncio.to_thread(supervisor_alive, record):
                    break
                else:
                    await asyncio.sleep(POLL_S)
        finally:
            if watch is not None:
                watch.close()
            elif supervisor is not None:
                supervisor.close()
        record = await self._stopping.close_orphaned(operation_id)
        await self._delivered.deliver_log(operation_id, self._records.log_path(operation_id), on_output, complete=True)
        return record

    def _snapshot(self, operation_id: str, offset: int) -> tuple[HookRecord, bytes]:
        """The record, then the log from `offset`: once the record is finished, that log is complete."""
        record = self._records.read(operation_id)
        if record is None:
            raise FileNotFoundError(f"hook record for {operation_id!r} disappeared")
        if record.finished_at is None:
            record = self._records.held_outcome(record) or record
        return record, read_from(self._records.log_path(operation_id), offset)

    async def _record_once_adopted(self, operation_id: str) -> HookRecord | None:
        """The record, after this process's own in-flight run has recorded its supervisor."""
        while True:
            record = await asyncio.to_thread(self._records.read, operation_id)
            starting = record is not None and record.finished_at is None and record.supervisor_pid is None
            if not (starting and operation_id in self._in_flight):
                return record
            await asyncio.sleep(POLL_S)


def _check_identity(record: HookRecord, kind: str, workspace: Path) -> None:
    if (record.kind, record.workspace) != (kind, str(workspace)):
        raise HookIdentityMismatch(
            f"operation {record.operation_id!r} is the {record.kind} hook of {record.workspace}, "
            f"not the {kind} hook of {workspace}"
        )


def _close_untaken(begun: _Begun) -> None:
    """Once the step is done, close the supervisor it started, or retrieve its error: its run
    ended without taking either."""

    def close(begun: _Begun) -> None:
        if begun.cancelled() or begun.exception() is not None:
            return
        supervisor = begun.result()[2]
        if supervisor is not None:
            supervisor.close()

    begun.add_done_callback(close)


def _outcome(record: HookRecord) -> HookOutcome:
    assert record.outcome is not None
    return HookOutcome(record.outcome, record.exit_code, record.message)
