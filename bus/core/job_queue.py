"""The core's side of the hosts' work queues: queue a job for a host and wait for its report.

A job waits in stream BB_HOST_JOBS under its host's subjects until that host's agent takes it,
however long the agent is away; its id is the operation's, so queueing it again (a core that
restarted, a step driven twice) adds nothing while the first is kept. The agent's report is
stored in BB_HOST_REPORTS, the newest per operation, so a core that was away when it came reads
it there. While the host's agent is not heard from, a wait ends with HostUnavailable (the job
stays queued): the provisioning driver records that the environment waits for its host, and asks
again; a report found by then is taken, the job is not queued twice.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from bb_environments.bus.health import BUS_UNAVAILABLE, BusHealth, describe
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.host_protocol import HostHeartbeat, HostJob, HostReport
from bb_environments.handlers.machines import heard_recently
from bb_environments.handlers.ports import HostUnavailable

R = TypeVar("R", bound=HostReport)

REPORT_CHECK_S = 3.0
"""How often a wait looks for the report in the stream and at the host's heartbeat: a report
published while this core's subscription was away is found there."""


class HostLiveness:
    """The agents' heartbeats, as bucket BB_HOSTS keeps them."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._bucket: KeyValue | None = None

    async def heartbeat(self, host_id: str) -> HostHeartbeat | None:
        """The host's newest heartbeat, or None when its agent was never heard from."""
        if self._bucket is None:
            self._bucket = await self._js.key_value(subjects.HOSTS_BUCKET)
        try:
            entry = await self._bucket.get(host_id)
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        try:
            return msgspec.json.decode(entry.value, type=HostHeartbeat)
        except msgspec.ValidationError:
            return None  # only the host's own agent may write its key; a damaged value is "not heard"

    async def online(self, host_id: str) -> bool:
        return is_online(await self.heartbeat(host_id), datetime.now(UTC))

    async def forget(self, host_id: str) -> None:
        if self._bucket is None:
            self._bucket = await self._js.key_value(subjects.HOSTS_BUCKET)
        await self._bucket.purge(host_id)


def is_online(heartbeat: HostHeartbeat | None, now: datetime) -> bool:
    return heartbeat is not None and heard_recently(heartbeat.seen_at, now)


def waiting_for(host_id: str, heartbeat: HostHeartbeat | None) -> str:
    """The sentence an environment waiting for its host shows (statusMessage)."""
    if heartbeat is None:
        return f"waiting for the agent of host {host_id!r}, which has not connected since it was registered"
    seen = heartbeat.seen_at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return f"waiting for the agent of host {host_id!r}, offline since {seen}"


class HostJobQueue:
    def __init__(
        self, nc: Client, js: JetStreamContext, liveness: HostLiveness, *, health: BusHealth | None = None
    ) -> None:
        self._nc = nc
        self._js = js
        self._liveness = liveness
        self._health = health or BusHealth()

    async def run(self, host_id: str, job: HostJob, report_type: type[R], *, again: bool = False) -> R:
        """The report of `job` on `host_id`: found stored, or queued and waited for.

        `again`: the job is one the log does not record the outcome of when it fails (the cleanup
        of a failed create attempt), so a stored report answers nothing and the job is queued anew
        (under an id of its own: doing it twice is harmless). Raises HostUnavailable while the
        host's agent is not heard from (the job stays queued)."""
        operation_id = job.operation_id
        report_subject = subjects.host_report(host_id, operation_id)
        arrived: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        async def on_report(message: Msg) -> None:
            if message.subject == report_subject and not arrived.done():
                arrived.set_result(message)

        subscription = await self._nc.subscribe(report_subject, cb=on_report)
        try:
            if not again and (stored := await self._stored_report(report_subject, report_type, operation_id)):
                return stored
            await self._unless_away(host_id, f"queueing {operation_id}")
            await self._queue(host_id, job, f"{operation_id}@{time.time_ns()}" if again else operation_id)
            while True:
                try:
                    message = await asyncio.wait_for(asyncio.shield(arrived), REPORT_CHECK_S)
                except TimeoutError:
                    if (stored := await self._stored_report(report_subject, report_type, operation_id)) is not None:
                        return stored
                    await self._unless_away(host_id, f"waiting for {operation_id}")
                    continue
                if (report := _decoded(message.data, report_type, operation_id)) is not None:
                    return report
                arrived = asyncio.get_running_loop().create_future()
        finally:
            await subscription.unsubscribe()

    async def _queue(self, host_id: str, job: HostJob, message_id: str) -> None:
        try:
            await self._js.publish(
                subjects.host_job(host_id, job.operation_id),
                msgspec.json.encode(job),
                stream=subjects.HOST_JOBS_STREAM,
                headers={"Nats-Msg-Id": message_id},
            )
        except BUS_UNAVAILABLE as error:
            raise HostUnavailable(
                f"the job {job.operation_id} for host {host_id!r} could not be queued ({describe(error)})"
            ) from None

    async def _stored_report(self, report_subject: str, report_type: type[R], operation_id: str) -> R | None:
        try:
            stored = await self._js.get_last_msg(subjects.HOST_REPORTS_STREAM, report_subject)
        except NotFoundError:
            return None
        except BUS_UNAVAILABLE:
            return None  # the next check looks again
        return _decoded(stored.data or b"", report_type, operation_id)

    async def _unless_away(self, host_id: str, doing: str) -> None:
        if (away := await self.away(host_id, doing)) is not None:
            raise away

    async def away(self, host_id: str, doing: str) -> HostUnavailable | None:
        """Why the host's work waits now, if it does: its agent is not heard from, or the bus is away."""
        try:
            heartbeat = await self._liveness.heartbeat(host_id)
        except BUS_UNAVAILABLE as error:
            return HostUnavailable(f"{doing}: the bus is away ({describe(error)})")
        return None if is_online(heartbeat, datetime.now(UTC)) else HostUnavailable(waiting_for(host_id, heartbeat))


def _decoded(data: bytes, report_type: type[R], operation_id: str) -> R | None:
    """A report of the expected kind for `operation_id`; anything else is ignored:
    only the host's own agent may publish on its report subjects, and a report of another kind
    under the same operation's subject answers nothing here."""
    try:
        report = msgspec.json.decode(data, type=report_type)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return report if report.operation_id == operation_id else None
