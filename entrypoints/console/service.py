"""What the console reads from the bb service, as the operator, over one connection that is opened
again when it was lost (a restarted nats-server, say): the page says the service is unreachable
meanwhile and catches up by itself."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from bb_environments.bus.wire.api_messages import MAX_PAGE, EnvironmentRef, ListEnvironments, ListHistory, Nothing
from bb_environments.bus.wire.service_errors import ServiceError
from bb_environments.entrypoints.cli.connection import open_client
from bb_environments.entrypoints.config import Settings

if TYPE_CHECKING:
    from bb_environments.bus.api_client.nats_client import ApiClient

OPTIONAL_ASK_S = 1.0
"""How long a request the service may not answer at all waits (an older service, or one without pools)."""
OPTIONAL_AGAIN_S = 60.0
"""How soon an API the service lacked is asked about again (a newer service may have started)."""


class Service:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: ApiClient | None = None
        self._opening = asyncio.Lock()
        self._lacking: dict[str, float] = {}

    async def client(self) -> ApiClient:
        """The open connection; a new one when the last was closed for good (it raises ServiceError
        while the service is unreachable)."""
        async with self._opening:
            if self._client is None or self._client.nc.is_closed:
                self._client = await open_client(self._settings)
            return self._client

    async def call(self, area: str, verb: str, body: Any, timeout: float = 30) -> dict[str, Any]:
        return await (await self.client()).call(area, verb, body, timeout=timeout)

    async def environments(self) -> list[dict[str, Any]]:
        """Every environment that is not removed, page by page."""
        found: list[dict[str, Any]] = []
        request = ListEnvironments(limit=MAX_PAGE)
        while True:
            page = await self.call("environments", "list", request)
            found.extend(page["environments"])
            if page.get("next") is None:
                return found
            request = ListEnvironments(limit=MAX_PAGE, after=page["next"])

    async def machines(self) -> list[dict[str, Any]]:
        return list((await self.call("machines", "list", Nothing()))["machines"])

    async def replicas(self) -> list[dict[str, Any]] | None:
        """The core replicas running now, or None from a service that cannot list them."""
        return await self._optional("replicas", "list", "replicas")

    async def pools(self) -> list[dict[str, Any]] | None:
        """The pools (SPEC §10), or None from a service that has no pools to list."""
        return await self._optional("pools", "list", "pools")

    async def environment(self, environment_id: str) -> dict[str, Any]:
        return await self.call("environments", "show", EnvironmentRef(environment_id=environment_id))

    async def history(self, environment_id: str) -> list[dict[str, Any]]:
        """The environment's events in log order, each with the time to the next."""
        events: list[dict[str, Any]] = []
        request = ListHistory(environment_id=environment_id, limit=MAX_PAGE)
        while True:
            page = await self.call("environments", "history", request)
            events.extend(page["events"])
            if page.get("next") is None:
                return events
            request = ListHistory(environment_id=environment_id, limit=MAX_PAGE, after=page["next"])

    async def _optional(self, area: str, verb: str, key: str) -> list[dict[str, Any]] | None:
        """What an API this service may not have answers; None while nothing answers it. A service that
        answers the rest but not this one lacks it: it is asked again only now and then."""
        subject = f"{area}.{verb}"
        if time.monotonic() < self._lacking.get(subject, 0.0):
            return None
        try:
            answer = await self.call(area, verb, Nothing(), timeout=OPTIONAL_ASK_S)
        except ServiceError as unanswered:
            if unanswered.code != "unreachable":
                raise
            self._lacking[subject] = time.monotonic() + OPTIONAL_AGAIN_S
            return None
        self._lacking.pop(subject, None)
        return list(answer.get(key) or [])

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
