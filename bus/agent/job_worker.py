"""The host agent's side of its work queue: take each job queued for this host, do it, report it.

The agent pulls from its host's own durable consumer of BB_HOST_JOBS (no other NATS user may), so
a job queued while it was away waits for it. A job is done under its operation id: a create or
removal is the provider's, which is idempotent per attempt; a hook is the durable hook runner's,
which starts it at most once and joins it after a restart. The report is stored (BB_HOST_REPORTS)
before the job is acknowledged: a kill between the two, or an acknowledgement lost, has the job
delivered again, and doing it again reports the same, except a create whose attempt was removed
meanwhile, which the host refuses (providers/host/attempt_records.py). While a job runs the agent tells the server it is still at it, so a long
hook is not handed out a second time; one that an agent killed mid-job was holding is delivered
again once its acknowledgement wait has passed.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import VERB, HookReport, HostJob, HostReport
from bb_environments.domain.ids import quoted
from bb_environments.hooks.local_host import LocalHost
from bb_environments.providers.host.crash_points import crash_point

log = logging.getLogger(__name__)

JOBS_AT_ONCE = 32
STILL_AT_IT_S = 2.0
"""Well within the consumer's acknowledgement wait (bus/jetstream.py HOST_JOB_ACK_WAIT_S)."""
LEDGER_AWAY_RETRY_S = 2.0


class HostJobWorker:
    def __init__(self, nc: Client, host_id: str, host: LocalHost, *, health: BusHealth | None = None) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._host_id = host_id
        self._host = host
        self._health = health or BusHealth()
        self._doing: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(JOBS_AT_ONCE)

    async def run(self) -> None:
        subscription = await self._js.pull_subscribe_bind(
            durable=subjects.host_jobs_consumer(self._host_id), stream=subjects.HOST_JOBS_STREAM
        )
        bus = self._health.retry(f"taking the jobs of host {self._host_id!r}")
        try:
            while True:
                await self._slots.acquire()  # one slot held while asking: a free one for the job fetched
                try:
                    messages = await subscription.fetch(1, timeout=5)
                except NatsTimeout:
                    bus.succeeded()
                    continue
                except BUS_UNAVAILABLE as error:
                    await bus.pause(error)
                    continue
                finally:
                    self._slots.release()
                bus.succeeded()
                for message in messages:
                    await self._slots.acquire()
                    task = asyncio.create_task(self._take(message))
                    task.add_done_callback(lambda _: self._slots.release())
        finally:
            await asyncio.gather(*self._doing.values(), return_exceptions=True)

    async def _take(self, message: Msg) -> None:
        try:
            job = msgspec.json.decode(message.data, type=HostJob)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            log.warning("dropped a malformed job on %s", quoted(message.subject))
            await message.term()
            return
        if job.operation_id in self._doing:
            return  # delivered again while it runs here: the run's report answers both
        task = asyncio.current_task()
        assert task is not None
        self._doing[job.operation_id] = task
        still_at_it = asyncio.create_task(_keep_telling(message))
        try:
            report = await self._do(job)
            if report is None:
                await message.nak(delay=LEDGER_AWAY_RETRY_S)
                return
            crash_point("agent-job-done")
            await self._report(report)
            crash_point("agent-job-reported")
            await message.ack()
        except BUS_UNAVAILABLE as error:
            # Not acknowledged: delivered again when the bus is back, and done again the same way.
            self._health.noticed(f"reporting job {job.operation_id}", error)
        finally:
            still_at_it.cancel()
            self._doing.pop(job.operation_id, None)

    async def _do(self, job: HostJob) -> HostReport | None:
        """The job's report, as its verb's row answers it; None when it cannot be decided now (the
        core's log is out of reach)."""
        verb = VERB[type(job).__struct_config__.tag]  # type: ignore[index]  # every job type is tagged
        try:
            report: HostReport = await verb.answered_by(self._host, self._host_id, job)
        except BUS_UNAVAILABLE:
            return None
        if isinstance(report, HookReport) and report.refused is not None:
            log.warning("refused hook job %s: %s", quoted(job.operation_id), report.refused)
        return report

    async def _report(self, report: HostReport) -> None:
        await self._js.publish(
            subjects.host_report(self._host_id, report.operation_id),
            msgspec.json.encode(report),
            stream=subjects.HOST_REPORTS_STREAM,
        )


async def _keep_telling(message: Msg) -> None:
    while True:
        await asyncio.sleep(STILL_AT_IT_S)
        try:
            await message.in_progress()
        except BUS_UNAVAILABLE:
            pass  # the job may be handed out again meanwhile; the operation id makes that harmless
