"""A message on a stored log subject that the event store did not write neither jams the relay nor
reaches a read model, a waiter or the relay's position (SPEC section 6).

The bus here is a plain nats-server without permissions, so anyone may publish anything: what is
tested is the service's own distrust, behind whatever permissions a deployment sets. The first
tests drive the relay and the consumers' check directly against a real nats-server; the last one
forges messages under a real `bb serve` while an environment is being set up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import msgspec
import nats
import pytest
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from bb_environments.bus.core.log_reader import LoggedDocument, LogReader
from bb_environments.bus.core.relay import AckedPublisher, OutboxRelay, PublishAck, Publisher
from bb_environments.bus.core.trusted_log import TrustedLog
from bb_environments.bus.embedded_server import EmbeddedNats
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.subjects import NOTIFICATION_HEADER
from bb_environments.handlers.application import Environments
from tests.integration.conftest import Service, Stored, plain_jetstream, service_environment, stream_log, write_hooks


class Step(msgspec.Struct):
    """Stands for a log document: the relay and the check only encode it."""

    type: str
    number: int


class MemoryLog:
    """The store's notification log, as the relay and the consumers' check read it."""

    def __init__(self) -> None:
        self.documents: list[LoggedDocument] = []

    def append(self, count: int) -> None:
        for _ in range(count):
            n = len(self.documents) + 1
            self.documents.append(LoggedDocument(n, f"bb.log.environment.e{n % 2}.step", Step("step", n)))

    async def page(self, after: int) -> list[LoggedDocument]:
        return self.documents[after : after + 500]

    async def at(self, ids: Iterable[int]) -> dict[int, LoggedDocument]:
        return {n: self.documents[n - 1] for n in ids if 0 < n <= len(self.documents)}

    def stored(self) -> list[Stored]:
        return [(d.notification_id, d.subject, d.payload()) for d in self.documents]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{check.__qualname__} did not hold within {timeout} s")
        await asyncio.sleep(0.05)


async def deleted(js: JetStreamContext, sequence: int) -> bool:
    try:
        await js.get_msg(subjects.ENVIRONMENTS_STREAM, sequence)
    except NotFoundError:
        return True
    return False


def forged_ready(environment_id: str) -> bytes:
    return json.dumps(
        {
            "type": "ready",
            "environmentId": environment_id,
            "version": 99,
            "threadIds": ["t1"],
            "status": "ready",
            "occurredAt": "2026-01-01T00:00:00Z",
        }
    ).encode()


def heal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "bb_environments.bus.core.relay" and "did not write" in r.getMessage()
    ]


# -- the relay and the consumers' check, against a real nats-server -------------------------------


@pytest.fixture
async def js(tmp_path: Path) -> AsyncIterator[JetStreamContext]:
    async with plain_jetstream(
        tmp_path / "nats",
        api.StreamConfig(
            name=subjects.ENVIRONMENTS_STREAM,
            subjects=[subjects.LOG_EVENTS],
            storage=api.StorageType.FILE,
            duplicate_window=120,
        ),
    ) as jetstream:
        yield jetstream


@pytest.fixture
def store() -> MemoryLog:
    return MemoryLog()


class Relays:
    """Relays run as tasks, cancelled at the end of the test."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task] = []

    def start(
        self, js: JetStreamContext, store: MemoryLog, poll_seconds: float = 60, publisher: Publisher | None = None
    ) -> OutboxRelay:
        relay = OutboxRelay(js, publisher or AckedPublisher(js._nc), store.page, store.at, poll_seconds)
        self.tasks.append(asyncio.create_task(relay.run()))
        return relay

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


@pytest.fixture
async def relays() -> AsyncIterator[Relays]:
    running = Relays()
    try:
        yield running
    finally:
        await running.stop()


async def relayed(js: JetStreamContext, store: MemoryLog) -> None:
    """Wait until the stream holds exactly the store's log."""

    async def stream_equals_store() -> bool:
        return await stream_log(js) == store.stored()

    await eventually(stream_equals_store)


async def test_a_publish_refused_after_forged_messages_heals_the_stream_once(js, store, relays, caplog):
    caplog.set_level(logging.WARNING)
    store.append(3)
    relay = relays.start(js, store)
    await relayed(js, store)

    without_headers = await js.publish("bb.log.environment.e0.ready", b'{"type": "ready"}')
    next_id = {"Nats-Msg-Id": "bb:4", NOTIFICATION_HEADER: "4"}
    with_next_id = await js.publish("bb.log.environment.e0.step", b'{"type": "step", "number": 4}', headers=next_id)
    store.append(2)
    relay.wake()

    await relayed(js, store)
    assert await deleted(js, without_headers.seq) and await deleted(js, with_next_id.seq)
    assert relay.position == 5
    assert len(heal_lines(caplog)) == 1


class ForgedAheadOfWindow:
    """The relay's publisher, except that once, a forged message reaches the stream just before the
    publish of notification `ahead_of`, while the rest of its window waits to follow."""

    def __init__(self, js: JetStreamContext, ahead_of: int) -> None:
        self._js = js
        self._publisher = AckedPublisher(js._nc)
        self._ahead_of = ahead_of
        self._landed = asyncio.Event()
        self.forged: api.PubAck | None = None

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PublishAck]:
        notification_id = int(headers[NOTIFICATION_HEADER])
        if notification_id == self._ahead_of and self.forged is None:
            self.forged = await self._js.publish("bb.log.environment.e0.ready", b'{"type": "ready"}')
            self._landed.set()
        elif notification_id > self._ahead_of:
            await self._landed.wait()
        return await self._publisher.publish_async(subject, payload, headers)


async def test_a_message_forged_into_a_window_leaves_no_gap_in_the_stream(js, store, relays, caplog):
    """The forgery takes the place the window's first message expected, so that message is refused;
    the second one expects the forgery's sequence and lands after it: the relay sees that it follows
    no message of the store's and deletes it, or the stream would go on without the first."""
    caplog.set_level(logging.WARNING)
    store.append(2)
    relays.start(js, store)
    await relayed(js, store)
    forging = ForgedAheadOfWindow(js, ahead_of=3)
    await relays.stop()
    relays.start(js, store, publisher=forging)
    store.append(3)

    await relayed(js, store)
    assert forging.forged is not None and await deleted(js, forging.forged.seq)
    window, heal = heal_lines(caplog)
    assert "published after a message the event store did not write" in window and "sequence 3" in heal


async def test_an_idle_relay_deletes_a_forged_message_without_waiting_for_the_next_event(js, store, relays, caplog):
    caplog.set_level(logging.WARNING)
    store.append(2)
    relays.start(js, store, poll_seconds=0.1)
    await relayed(js, store)

    forged = await js.publish("bb.log.environment.e0.ready", b'{"type": "ready"}', headers={NOTIFICATION_HEADER: "3"})

    await eventually(lambda: deleted(js, forged.seq))
    assert await stream_log(js) == store.stored()
    assert len(heal_lines(caplog)) == 1


async def test_a_restarted_relay_takes_replayed_copies_for_forgeries_and_doubles_nothing(js, store, relays):
    store.append(5)
    relays.start(js, store)
    await relayed(js, store)
    await relays.stop()
    # Verbatim copies of stored messages, sent again later: right content, wrong place.
    for n in (2, 3):
        original = await js.get_msg(subjects.ENVIRONMENTS_STREAM, n)
        await js.publish(original.subject, original.data, headers={NOTIFICATION_HEADER: str(n)})
    without_id = await js.publish("bb.log.environment.e1.ready", b"{}")

    store.append(2)
    relays.start(js, store)

    await relayed(js, store)
    assert await deleted(js, without_id.seq)


async def test_a_publish_the_stream_calls_a_duplicate_is_not_taken_as_stored(js, store, relays, monkeypatch):
    store.append(1)
    relay = relays.start(js, store)
    await relayed(js, store)
    # A forger who guessed the id of the relay's second try at notification 2: the forged message
    # is deleted by the heal after the first try, but its id stays in the duplicate window.
    tokens = iter(["first-try", "guessed"])
    token_hex = secrets.token_hex
    monkeypatch.setattr(
        "bb_environments.bus.core.relay.secrets.token_hex", lambda size: next(tokens, None) or token_hex(size)
    )
    await js.publish("bb.log.environment.e0.step", b"{}", headers={"Nats-Msg-Id": "bb:2:guessed"})

    store.append(1)
    relay.wake()

    await relayed(js, store)
    assert next(tokens, None) is None  # the guessed id was tried, answered as a duplicate, and passed over


async def test_two_relays_on_one_store_never_reorder_or_double_the_log(js, store, relays, caplog):
    caplog.set_level(logging.WARNING)
    first, second = relays.start(js, store), relays.start(js, store)
    for _ in range(20):
        store.append(3)
        first.wake()
        second.wake()
        await asyncio.sleep(0)

    await relayed(js, store)
    assert heal_lines(caplog) == []  # what the other relay wrote is the store's: nothing to delete


async def test_consumers_admit_only_what_the_store_wrote_and_use_the_stores_document(js, store, relays, caplog):
    caplog.set_level(logging.WARNING)
    store.append(2)
    relays.start(js, store)
    await relayed(js, store)
    await relays.stop()
    await js.publish("bb.log.environment.e1.ready", b'{"type": "ready"}')
    await js.publish(store.documents[1].subject, b'{"type": "step", "number": 99}', headers={NOTIFICATION_HEADER: "2"})
    await js.publish("bb.log.environment.e1.step", b"{}", headers={NOTIFICATION_HEADER: "9" * 5000})
    subscription = await js.pull_subscribe(subjects.LOG_EVENTS, "checked", stream=subjects.ENVIRONMENTS_STREAM)

    admitted = await TrustedLog(store.at, "test").admit(await subscription.fetch(5, timeout=5))

    assert [(a.logged.notification_id, a.logged.document) for a in admitted] == [
        (1, Step("step", 1)),
        (2, Step("step", 2)),
    ]
    skipped = [r.getMessage() for r in caplog.records if r.name == "bb_environments.bus.core.trusted_log"]
    assert skipped == [
        "test consumer skipped 3 log stream message(s) the event store did not write (sequences 3, 4, 5)"
    ]


# -- under a real `bb serve` -----------------------------------------------------------------------


@pytest.fixture
def plain_nats(tmp_path: Path) -> Iterable[EmbeddedNats]:
    server = EmbeddedNats.start(tmp_path / "plain-nats")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def served(tmp_path: Path, plain_nats: EmbeddedNats) -> AsyncIterator[Service]:
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_NATS_URL=plain_nats.url))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


@pytest.fixture
async def forger(plain_nats: EmbeddedNats) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(plain_nats.url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


def store_log(data_dir: Path) -> list[Stored]:
    """The store's whole notification log, as the relay publishes it (read-only, beside the service)."""
    app = Environments(
        env={
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "CREATE_TABLE": "no",
            "SQLITE_DBNAME": f"file:{data_dir / 'events.sqlite'}?mode=ro",
        }
    )
    try:
        reader, stored, position = LogReader(app), [], 0
        while page := reader.page(position):
            stored.extend((d.notification_id, d.subject, d.payload()) for d in page)
            position = page[-1].notification_id
        return stored
    finally:
        app.close()


async def stream_matches_store(js: JetStreamContext, service: Service) -> None:
    """Wait until the stream holds the store's log: in order, each once, byte for byte, nothing else."""

    async def stream_equals_store() -> bool:
        return await stream_log(js) == store_log(service.data_dir)

    await eventually(stream_equals_store)


async def settled(js: JetStreamContext, forged_sequence: int) -> None:
    """The relay deleted the forged message and the service's log consumers have nothing left to take."""

    async def relay_deleted_it_and_consumers_are_idle() -> bool:
        if not await deleted(js, forged_sequence):
            return False
        info = await js.consumer_info(subjects.ENVIRONMENTS_STREAM, "projections")
        return not (info.num_pending or info.num_ack_pending)

    await eventually(relay_deleted_it_and_consumers_are_idle)


async def test_forged_log_messages_during_setup_change_nothing_and_a_restart_doubles_nothing(
    served, forger, git_repo, tmp_path
):
    release = tmp_path / "release-setup"
    write_hooks(git_repo, tmp_path / "hooks.log", setup=f"while [ ! -e {release} ]; do sleep 0.05; done")
    spawning = asyncio.create_task(
        served.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(git_repo),
            "--thread-id",
            "t1",
            "--wait",
            "--json",
        )
    )
    environment_id = (await served.wait_for_thread("t1", having="environmentId"))["environmentId"]
    await served.wait_for(environment_id, lambda e: e["hooks"]["setup"]["status"] == "running")
    ready_subject = subjects.log_event("environment", environment_id, "ready")

    # (b) the id and header of the notification the relay publishes next, with other content.
    next_id = max(n for n, _, _ in await stream_log(forger)) + 1
    taking_the_next_id = await forger.publish(
        ready_subject,
        forged_ready(environment_id),
        headers={"Nats-Msg-Id": f"bb:{next_id}", NOTIFICATION_HEADER: str(next_id)},
    )
    await settled(forger, taking_the_next_id.seq)
    # (a) no headers at all.
    without_headers = await forger.publish(ready_subject, forged_ready(environment_id))
    await settled(forger, without_headers.seq)

    shown = await served.show(environment_id)
    assert (shown["status"], shown["hooks"]["setup"]["status"]) == ("provisioning", "running")
    assert not spawning.done()

    release.touch()
    spawned = await spawning
    assert spawned.returncode == 0, spawned.stderr
    assert spawned.json()["status"] == "ready"
    shown = await served.show(environment_id)
    assert shown["hooks"]["setup"]["status"] == "succeeded"
    await stream_matches_store(forger, served)
    await served.stop()

    # Stopped, the stream gains a forgery and a verbatim copy of a stored message; the service
    # starts on it, archives the thread and removes the environment.
    await forger.publish(ready_subject, forged_ready(environment_id))
    copied = await forger.get_msg(subjects.ENVIRONMENTS_STREAM, 1)
    await forger.publish(copied.subject, copied.data, headers={NOTIFICATION_HEADER: "1"})
    await served.start()
    assert (await served.bb("thread", "archive", "t1")).returncode == 0
    await served.wait_for(environment_id, "removed")
    await stream_matches_store(forger, served)

    exported = await served.bb("events", "export")
    assert exported.stdout.splitlines() == [payload.decode() for _, _, payload in store_log(served.data_dir)]
    serve_log = (served.data_dir.parent / "serve.log").read_text().splitlines()
    heals = [line for line in serve_log if "bb_environments.bus.core.relay:" in line and "did not write" in line]
    assert len(heals) == 3, heals  # one per forgery while running, one for both found at the restart
