"""What the open pages are told, as it happens: the service's environment events (plain subscriptions
on `bb.environments.>`, which the operator may read) say when to read the fleet or an environment
again through the API; an environment's transcript is read from its stream as it grows. Hosts'
last-seen times and ages change without an event: they are read again every REFRESH_S too."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

from nats.errors import Error as NatsError

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.service_errors import ServiceError
from bb_environments.entrypoints.console.service import Service
from bb_environments.entrypoints.console.views import Parts, environment_parts, fleet_parts, problem_parts

REFRESH_S = 5.0
SETTLE_S = 0.2
"""After an event, how long more events may come before the page is read again: a burst makes one read."""
TRANSCRIPT_WAIT_S = 5.0

Update = tuple[str, Any]
"""A server-sent event: its name and its data (JSON)."""
ENDED: Update = ("ended", None)


class FleetFeed:
    """The fleet page's parts, read once for every page open however many there are."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self.parts: Parts = fleet_parts([], [], None, None, datetime.now(UTC))
        self._changed = asyncio.Event()
        self._published = asyncio.Condition()
        self._version = 0
        self._heard_on: object | None = None
        self._replicas: dict[str, dict[str, Any]] = {}
        """Every replica this console saw, with when it last did: a replica's presence ends with it."""

    async def run(self) -> None:
        """Read the fleet again after each burst of events, and every REFRESH_S, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REFRESH_S)
            await asyncio.sleep(SETTLE_S)
            self._changed.clear()
            await self.refresh()

    async def refresh(self) -> None:
        try:
            client = await self._service.client()
            if client is not self._heard_on:  # a new connection: subscribe on it
                await client.nc.subscribe(subjects.ENVIRONMENT_EVENTS, cb=self._heard)
                self._heard_on = client
            environments = await self._service.environments()  # first: a service away fails here, once
            machines, replicas, pools = await asyncio.gather(
                self._service.machines(), self._service.replicas(), self._service.pools()
            )
            now = datetime.now(UTC)
            parts = fleet_parts(environments, machines, self._seen(replicas, now), pools, now)
        except (ServiceError, NatsError) as lost:
            parts = problem_parts(_problem(lost))
        async with self._published:
            self.parts = {**self.parts, **parts}
            self._version += 1
            self._published.notify_all()

    def _seen(self, present: list[dict[str, Any]] | None, now: datetime) -> list[dict[str, Any]] | None:
        """The replicas present now (online, seen now) and those seen before that are gone (offline)."""
        if present is None:
            return None
        for replica in self._replicas.values():
            replica["status"] = "offline"
        for replica in present:
            self._replicas[replica["replicaId"]] = {**replica, "status": "online", "lastSeenAt": now.isoformat()}
        return sorted(self._replicas.values(), key=lambda r: r["replicaId"])

    async def updates(self) -> AsyncGenerator[Update, None]:
        """The parts now, then again each time they were read."""
        seen = self._version
        yield "parts", self.parts
        while True:
            async with self._published:
                await self._published.wait_for(lambda: self._version > seen)
                seen = self._version
            yield "parts", self.parts

    async def _heard(self, _: Any) -> None:
        self._changed.set()


async def environment_updates(service: Service, environment_id: str) -> AsyncGenerator[Update, None]:
    """One environment's parts, again after each of its events and every REFRESH_S; and its
    transcript: a `reset`, then every line from the start of what the stream keeps, as it comes."""
    client = await service.client()
    whole_id = (await service.environment(environment_id))["id"]  # a start of an id resolved
    updates: asyncio.Queue[Update] = asyncio.Queue()
    changed = asyncio.Event()

    async def heard(_: Any) -> None:
        changed.set()

    async def parts() -> None:
        while True:
            try:
                shown = await service.environment(whole_id)
                await updates.put(("parts", environment_parts(shown, await service.history(whole_id), _now())))
            except (ServiceError, NatsError) as lost:
                await updates.put(("parts", problem_parts(_problem(lost))))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), REFRESH_S)
            await asyncio.sleep(SETTLE_S)
            changed.clear()

    async def lines() -> None:
        reader = client.read_stream(subjects.TRANSCRIPTS_STREAM, subjects.transcript(whole_id), TRANSCRIPT_WAIT_S)
        try:
            async with contextlib.aclosing(reader) as batches:
                async for batch in batches:
                    for message in batch:
                        await updates.put(("line", _line(message.data)))
        except NatsError:  # the connection is gone: the page connects again, and reads from the start
            await updates.put(ENDED)

    subscription = await client.nc.subscribe(subjects.environment_event(whole_id), cb=heard)
    workers = [asyncio.create_task(parts()), asyncio.create_task(lines())]
    try:
        yield "reset", None
        while (update := await updates.get()) is not ENDED:
            yield update
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        with contextlib.suppress(NatsError):
            await subscription.unsubscribe()


def _line(data: bytes) -> dict[str, Any]:
    """A transcript line for the page: when, whether it is a step of the work, what it says."""
    try:
        line = json.loads(data)
        return {"at": str(line["occurredAt"]), "step": line.get("kind") == "step", "text": str(line["text"])}
    except (ValueError, KeyError, TypeError):  # not a line of ours: shown as it came
        return {"at": "", "step": False, "text": data.decode(errors="replace")}


def _problem(lost: Exception) -> str:
    said = lost.message if isinstance(lost, ServiceError) else f"the connection to it failed ({lost})"
    return f"Not current: {said}. The page catches up once the service answers again."


def _now() -> datetime:
    return datetime.now(UTC)
