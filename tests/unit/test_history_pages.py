"""An environment's history of thousands of events comes in pages, none past the maximum payload
of the connection that answers, and following `next` gives every event once, in order."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec

from bb_environments.bus.core.api_endpoints import ApiEdge
from bb_environments.bus.wire.api_messages import MAX_PAGE, ListHistory
from bb_environments.domain.environment import Environment
from bb_environments.handlers.api import HistoryQuery, Page
from bb_environments.projections.history import LoggedEvent

ENVIRONMENT = "6f1c5a44-3f43-4a5e-9d8e-0b5b3f7f2a11"
MAX_PAYLOAD = 8 * 1024


class ThousandsOfEvents:
    """The handlers' answer for an environment with 3000 events, a second apart."""

    def __init__(self) -> None:
        start = datetime(2030, 1, 1, tzinfo=UTC)
        self.events = [
            LoggedEvent(version, Environment.ThreadAttached, start + timedelta(seconds=version), 1000)
            for version in range(1, 3001)
        ]

    async def environment_history(self, query: HistoryQuery) -> Page[LoggedEvent]:
        found = self.events[query.after : query.after + query.limit]
        return Page(found, query.after + len(found) < len(self.events))


def test_thousands_of_events_come_in_pages_that_fit_one_message() -> None:
    api = ThousandsOfEvents()
    edge = ApiEdge(api, None, None, None, MAX_PAYLOAD, None)  # type: ignore[arg-type]  # the one handler the endpoint calls

    pages, after = [], 0
    while True:
        page = asyncio.run(
            edge.environment_history(ListHistory(environment_id=ENVIRONMENT, after=after, limit=MAX_PAGE))
        )
        assert len(msgspec.json.encode(page)) <= MAX_PAYLOAD
        pages.append(page)
        if page.next is None:
            break
        after = page.next

    assert len(pages) > 3
    assert [event.version for page in pages for event in page.events] == list(range(1, 3001))
    assert {event.type for page in pages for event in page.events} == {"thread_attached"}
    assert all(page.environment_id == ENVIRONMENT for page in pages)
