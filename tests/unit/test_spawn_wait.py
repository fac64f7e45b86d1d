"""`thread spawn --wait` returns on the event that says the environment settled, not on a poll:
an event that arrives before the spawn's answer, or while a look is under way, is not lost."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from bb_environments.entrypoints.cli import waiting

ENVIRONMENT = "3142f231-142f-4a87-9b66-0e0aaa28b153"


class FakeSubscription:
    async def unsubscribe(self) -> None:
        pass


class FakeClient:
    """The read model lags the events: a look shows `ready` only when asked for the ready event's
    position (or later), as the service's read model does once it reaches it."""

    def __init__(self, ready_position: int, send_ready_during: str) -> None:
        self.ready_position, self.send_ready_during = ready_position, send_ready_during
        self.looks: list[int] = []
        self._on_event = None
        self.nc = SimpleNamespace(
            subscribe=self._subscribe, jetstream=lambda: SimpleNamespace(subscribe=self._js_subscribe)
        )

    async def _subscribe(self, subject: str, cb) -> FakeSubscription:
        if subject.startswith("bb.environments."):
            self._on_event = cb
        return FakeSubscription()

    async def _js_subscribe(self, *args, **kwargs) -> FakeSubscription:
        return FakeSubscription()

    async def send_ready(self) -> None:
        message = SimpleNamespace(
            subject=f"bb.environments.{ENVIRONMENT}.ready",
            data=json.dumps({"status": "ready"}),
            headers={"Bb-Notification-Id": str(self.ready_position)},
        )
        await self._on_event(message)

    async def call(self, area: str, verb: str, request) -> dict:
        if verb == "spawn":
            if self.send_ready_during == "spawn":
                await self.send_ready()
            return {"threadId": "t", "environmentId": ENVIRONMENT, "status": "creating", "position": 3}
        self.looks.append(request.min_position)
        if self.send_ready_during == "look" and len(self.looks) == 1:
            await self.send_ready()  # after the read model answered, before the answer is read
        reached = request.min_position >= self.ready_position
        return {"status": "ready" if reached else "provisioning", "statusMessage": None}


@pytest.mark.parametrize("send_ready_during", ["spawn", "look"])
async def test_a_ready_that_came_early_is_acted_on_without_waiting_for_the_poll(monkeypatch, send_ready_during):
    monkeypatch.setattr(waiting, "WAIT_FALLBACK_POLL_S", 3600.0)
    client = FakeClient(ready_position=7, send_ready_during=send_ready_during)
    watch = waiting.SettleWatch()
    await watch.start(client)
    spawned = await client.call("threads", "spawn", None)
    final = await asyncio.wait_for(
        waiting.wait_until_settled(client, watch, spawned["environmentId"], spawned["position"], timeout=3600), 10
    )
    assert final["status"] == "ready"
    assert client.looks == [3, 7]  # the second look waits for the ready event's position


async def test_a_line_sent_again_is_shown_once_and_only_the_latest_lines_are_remembered(monkeypatch):
    monkeypatch.setattr(waiting, "REMEMBERED_LINE_IDS", 3)
    shown: list[str] = []
    monkeypatch.setattr(waiting, "_print_line", lambda data: shown.append(json.loads(data)["text"]))
    watch = waiting.SettleWatch()
    watch.follow(ENVIRONMENT)

    async def line(text: str, line_id: str | None) -> None:
        headers = None if line_id is None else {"Nats-Msg-Id": line_id}
        await watch._on_line(
            SimpleNamespace(
                subject=f"bb.transcripts.{ENVIRONMENT}",
                data=json.dumps({"kind": "output", "text": text}),
                headers=headers,
            )
        )

    for text, line_id in [("a", "op@0"), ("b", "op@2"), ("a", "op@0"), ("step", None), ("step", None)]:
        await line(text, line_id)
    assert shown == ["a", "b", "step", "step"]  # a line without an id is never taken for another

    for text, line_id in [("c", "op@4"), ("d", "op@6"), ("a", "op@0")]:
        await line(text, line_id)
    assert shown[-3:] == ["c", "d", "a"]  # past the bound, op@0 was forgotten
