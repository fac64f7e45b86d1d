"""Outages of the bus as nats-py reports them to the service's loops (issue 10, item 2), without a
server: a stream without a leader answers 503 (ServiceUnavailableError), a publish to it "no
response from stream" (NoStreamResponseError), a request nobody takes NoRespondersError. The loops
wait and go on, and the log says once that the bus went away and once that it came back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace

import msgspec
import pytest
from nats.errors import ConnectionClosedError, NoRespondersError, UnexpectedEOF
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from bb_environments.bus import health as health_module
from bb_environments.bus.core.log_reader import LoggedDocument
from bb_environments.bus.core.relay import OutboxRelay
from bb_environments.bus.health import BusHealth, describe, short_of_room, unavailable
from bb_environments.bus.jetstream import consume
from bb_environments.bus.wire.subjects import NOTIFICATION_HEADER

LOST, BACK = "lost the NATS bus", "the NATS bus is back"


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_module, "FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr(health_module, "LONGEST_PAUSE_S", 0.05)
    monkeypatch.setattr(health_module, "SETTLE_S", 0.05)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def told_once(caplog: pytest.LogCaptureFixture) -> None:
    lines = said(caplog)
    assert sum(LOST in line for line in lines) == 1 and sum(BACK in line for line in lines) == 1, lines
    assert not [record for record in caplog.records if record.exc_info], "a traceback"


async def eventually(condition, timeout: float = 10) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_an_outage_seen_by_many_is_told_once_and_its_end_once_all_are_back(caplog):
    caplog.set_level(logging.INFO)
    health = BusHealth()
    relay, consumer = health.retry("relay"), health.retry("consumer projections")
    for _ in range(5):
        relay.failed(NoStreamResponseError())
        consumer.failed(ServiceUnavailableError(code=503))
    relay.succeeded()
    assert not health.available  # the consumer still waits
    consumer.succeeded()
    relay.failed(NoStreamResponseError())  # at once again: the same outage, flapping
    relay.succeeded()
    assert health.available
    await eventually(lambda: any(BACK in line for line in said(caplog)))
    told_once(caplog)


def test_a_failure_that_is_not_the_bus_is_told_every_time(caplog):
    health = BusHealth()
    relay = health.retry("relay")
    for _ in range(2):
        relay.failed(APIError(code=500, description="insufficient resources"))
    assert health.available
    assert [LOST in line for line in said(caplog)] == [False, False] and "insufficient resources" in said(caplog)[0]


class Connection:
    is_closed = False
    is_reconnecting = False
    is_connected = True
    servers = ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]


async def test_a_connection_that_reconnects_for_minutes_is_told_once(caplog):
    caplog.set_level(logging.INFO)
    health = BusHealth()
    nc = Connection()
    callbacks = health.watch(nc, "bb-serve-local")
    await callbacks["error_cb"](UnexpectedEOF())
    nc.is_reconnecting = True
    await callbacks["disconnected_cb"]()
    for _ in range(100):  # what nats-py reports twice a second while the server is away
        await callbacks["error_cb"](ConnectionRefusedError(111, "Connect call failed"))
    nc.is_reconnecting = False
    await callbacks["reconnected_cb"]()
    await eventually(lambda: any(BACK in line for line in said(caplog)))
    told_once(caplog)

    caplog.clear()
    await callbacks["error_cb"](Exception("nats: 'Permissions Violation for Publish to \"bb.hosts.x\"'"))
    nc.is_closed = True
    await callbacks["disconnected_cb"]()  # closing it calls this too: no outage
    assert said(caplog) == ["nats (bb-serve-local): Exception: 'Permissions Violation for Publish to \"bb.hosts.x\"'"]


async def test_a_start_waits_for_a_forming_cluster_and_says_once_what_it_waits_for(caplog):
    caplog.set_level(logging.INFO)
    health = BusHealth(starting=True)
    nc = Connection()
    nc.is_connected = False
    callbacks = health.watch(nc, "bb-serve-r1")
    for _ in range(3):  # every server of the list refused the first connection, again and again
        await callbacks["error_cb"](ConnectionRefusedError(111, "Connect call failed"))
    health.back(nc)  # connected at last (jetstream.connect says so)
    answers = iter(
        [
            ServiceUnavailableError(code=503),
            NoStreamResponseError(),
            BadRequestError(code=400, err_code=10005, description="no suitable peers for placement, peer offline"),
            NotFoundError(code=404, err_code=10059, description="stream not found"),  # a server not current yet
            "made",
        ]
    )

    async def make_streams() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert await health.once_answered("the streams", make_streams) == "made"
    await asyncio.sleep(0.1)  # past the settling time: a start's waits are one, told when it is over
    assert [line for line in said(caplog) if "NATS" in line] == [
        "waiting for the NATS cluster before serving (connection bb-serve-r1: no server answers, the last "
        "ConnectionRefusedError: [Errno 111] Connect call failed); a cluster still forming is waited for as long "
        "as it takes"
    ]
    health.started()
    assert "the NATS cluster answered after" in said(caplog)[-1] and not any(LOST in line for line in said(caplog))


async def test_a_start_on_servers_without_room_for_a_stream_is_refused_not_waited_for():
    clustered = BadRequestError(
        code=400, err_code=10005, description="no suitable peers for placement, insufficient storage"
    )
    single = ServerError(code=500, err_code=10047, description="insufficient storage resources available")
    for refusal in (clustered, single):
        assert short_of_room(refusal) and not unavailable(refusal)

        async def make_streams() -> None:
            raise refusal

        with pytest.raises(APIError):
            await BusHealth(starting=True).once_answered("the streams", make_streams)
    # A peer that is offline may have the room once it is back: waited for.
    assert unavailable(
        BadRequestError(
            code=400, err_code=10005, description="no suitable peers for placement, peer offline, insufficient storage"
        )
    )


# -- consume ----------------------------------------------------------------------------------------


@dataclass
class FakeMessage:
    data: bytes
    settled: list[str] = field(default_factory=list)

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")


class ScriptedSubscription:
    """fetch() raises or returns what the script says, then finds nothing to fetch."""

    def __init__(self, script: Iterable[Exception | list[FakeMessage]]) -> None:
        self._script = list(script)

    async def fetch(self, batch: int, timeout: float) -> list[FakeMessage]:
        await asyncio.sleep(0)
        if not self._script:
            await asyncio.sleep(timeout)
            raise NatsTimeout
        step = self._script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


class ScriptedJetStream:
    def __init__(self, consumer_errors: list[Exception], subscription: ScriptedSubscription) -> None:
        self._consumer_errors = consumer_errors
        self._subscription = subscription

    async def consumer_info(self, stream: str, durable: str) -> object:
        raise NotFoundError  # a new consumer: the script starts with its creation

    async def add_consumer(self, stream: str, config: object) -> None:
        if self._consumer_errors:
            raise self._consumer_errors.pop(0)

    async def bind(self, js: object, durable: str, stream: str) -> ScriptedSubscription:
        return self._subscription


async def test_a_consumer_rides_out_a_stream_without_leader_and_handles_what_comes_after(caplog):
    caplog.set_level(logging.INFO)
    first, second = FakeMessage(b"1"), FakeMessage(b"2")
    subscription = ScriptedSubscription(
        [
            ServiceUnavailableError(code=503),
            NoRespondersError(),
            ConnectionClosedError(),
            [first],
            NatsTimeout(),
            [second],
        ]
    )
    js = ScriptedJetStream([ServiceUnavailableError(code=503)], subscription)
    handled: list[bytes] = []
    failures = [NoRespondersError()]  # the handler's own request finds nobody, once

    async def handle(messages: list[FakeMessage]) -> None:
        if failures:
            raise failures.pop()
        handled.extend(message.data for message in messages)

    consuming = asyncio.create_task(consume(js, "S", "projections", "s.>", handle, BusHealth(), bind=js.bind))
    try:
        await eventually(lambda: handled == [b"2"] and any(BACK in line for line in said(caplog)))
        assert not consuming.done()
    finally:
        consuming.cancel()
    assert first.settled == ["nak"] and second.settled == ["ack"]  # the first comes again, as a redelivery
    told_once(caplog)
    assert not [line for line in said(caplog) if "handling a batch failed" in line]  # not the handler's fault


# -- relay ------------------------------------------------------------------------------------------


class Step(msgspec.Struct):
    n: int


@dataclass
class StoredMessage:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


class FlakyStream:
    """Just enough JetStream for the relay, answering with the errors it is given first."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.messages: list[StoredMessage] = []

    def _maybe_fail(self) -> None:
        if self.errors:
            raise self.errors.pop(0)

    async def stream_info(self, stream: str) -> SimpleNamespace:
        self._maybe_fail()
        last = self.messages[-1].seq if self.messages else 0
        return SimpleNamespace(state=SimpleNamespace(last_seq=last, messages=len(self.messages)))

    async def get_msg(self, stream: str, seq: int) -> StoredMessage:
        self._maybe_fail()
        return next(message for message in self.messages if message.seq == seq)

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future:
        self._maybe_fail()
        ack: asyncio.Future = asyncio.get_running_loop().create_future()
        last = self.messages[-1].seq if self.messages else 0
        if int(headers["Nats-Expected-Last-Sequence"]) != last:
            ack.set_exception(APIError(code=400, err_code=10071))
        else:
            self.messages.append(StoredMessage(last + 1, subject, payload, dict(headers)))
            ack.set_result(SimpleNamespace(seq=last + 1, duplicate=False))
        return ack


async def test_the_relay_rides_out_no_stream_response_and_503_and_copies_the_log_once(caplog):
    caplog.set_level(logging.INFO)
    log = [LoggedDocument(n, f"bb.log.environment.e.{n}", Step(n)) for n in range(1, 6)]

    async def page(after: int) -> list[LoggedDocument]:
        return log[after : after + 2]

    async def at(ids: Iterable[int]) -> dict[int, LoggedDocument]:
        return {n: log[n - 1] for n in ids}

    stream = FlakyStream([ServiceUnavailableError(code=503), NoStreamResponseError(), NatsTimeout()])
    relay = OutboxRelay(stream, stream, page, at, poll_seconds=0.05, health=BusHealth())
    relaying = asyncio.create_task(relay.run())
    try:
        await eventually(lambda: len(stream.messages) == 5 and any(BACK in line for line in said(caplog)))
        stream.errors += [NoStreamResponseError(), TimeoutError()]  # the bus goes away again, idle
        await eventually(lambda: not stream.errors)
        log.append(LoggedDocument(6, "bb.log.environment.e.6", Step(6)))
        relay.wake()
        await eventually(lambda: len(stream.messages) == 6 and sum(BACK in line for line in said(caplog)) == 2)
        assert not relaying.done()
    finally:
        relaying.cancel()
    assert [int(m.headers[NOTIFICATION_HEADER]) for m in stream.messages] == [1, 2, 3, 4, 5, 6]
    lines = said(caplog)
    assert sum(LOST in line for line in lines) == 2 and sum(BACK in line for line in lines) == 2, lines


def test_a_key_value_error_without_the_api_fields_is_described_not_raised_again():
    # A replica's lease loop met one as its bucket's leader was killed, and the service exited
    # on an AttributeError while describing it.
    assert describe(KeyNotFoundError()) == "KeyNotFoundError: key not found"
    assert describe(APIError(code=503, description="no leader")) == "APIError: no leader"


async def test_a_key_value_error_met_by_a_loop_is_told_and_tried_again_not_a_crash(caplog):
    # A replica woken from a pause met one in its lease loop (nats-py's create of a key that expired
    # under it), and exited on an AttributeError while deciding whether the bus was away.
    assert not unavailable(KeyNotFoundError()) and not short_of_room(KeyNotFoundError())
    health = BusHealth()
    assert health.retry("lease relay").failed(KeyNotFoundError()) > 0
    assert health.available and "lease relay failed (KeyNotFoundError: key not found)" in said(caplog)[-1]

    async def look_up() -> None:
        raise KeyNotFoundError

    with pytest.raises(KeyNotFoundError):  # at a start, not waited for: its caller's to handle
        await BusHealth(starting=True).once_answered("the key", look_up)
