"""The outbox relay: copies the event store's notification log into JetStream, in order, once.

The stream is the cursor and the store is the truth. The relay goes on after the stream's last
message that is, byte for byte (subject and payload), what the store wrote under the notification
id the message claims, and deletes every message after that one: anyone who can publish on a
stored log subject can add a message to the stream, and such a message must neither stop the
relay nor move its position. This heal runs on start, when a publish is refused or ambiguous, and
when the stream grew while the relay was idle; each heal that deletes logs one warning line.

The relay publishes a window of messages at once and awaits their acks together. Each publish
carries `Nats-Expected-Last-Sequence` = the sequence it must follow (the stream's last sequence as
the relay last checked it, plus its place in the window). A replicated stream's leader checks it
against every publish it has accepted, committed or not, before it proposes the message: a refusal
never enters the stream's Raft log. That is the fence between two relays (one woken from a pause,
one that took the lease meanwhile): each message names the place it must take, and a place after
the store's messages holds, whoever published them, the store's next one; so a second relay, or a
retry of a publish that did land, is refused instead of reordering or doubling the log. No header
checked only when a message is applied is sent (`Nats-Expected-Last-Msg-Id` is one): a replicated
stream that refuses a message at that point takes it as a write error and stops for good.

A position alone can be taken by a forged message landing mid-window, after which the next
message's expected sequence would hold with the message before it missing. The relay checks the
acks: a message stored after one of its window that was not is kept only if the message it follows
is the store's one it should follow; otherwise it and the rest of the window are deleted (their
copies on `bb.environments.>` went out already: a forger with the service's credentials can make a
subscriber see an event twice, never make the stream skip or reorder one) and the heal runs.
`Nats-Msg-Id` is `bb:<notification id>:<random token>`: nobody can take an id before the relay uses
it, and a stored message sent again within the duplicate window is dropped.

With replicas, the relay runs while its replica holds the relay lease, and confirms the lease
(`still_leased`) before each heal and each window: a relay woken from a pause publishes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from bb_environments.bus.core.log_reader import LoggedDocument
from bb_environments.bus.health import BusHealth
from bb_environments.bus.wire import subjects
from bb_environments.providers.host.crash_points import crash_point

log = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071  # JetStream's error code when Nats-Expected-Last-Sequence does not hold
WINDOW = 64
"""Publishes in flight at once: a page of the log goes out in round trips of this many messages."""
PUBLISH_TIMEOUT_S = 5.0

PageReader = Callable[[int], Awaitable[list[LoggedDocument]]]
NotificationReader = Callable[[Iterable[int]], Awaitable[dict[int, LoggedDocument]]]


class StreamMoved(Exception):
    """The stream holds something the relay did not check: heal before publishing again."""


class LeaseLost(Exception):
    """This replica no longer holds the relay lease: publish nothing until it is taken again."""


class _Refusal(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class PublishAck(msgspec.Struct):
    """JetStream's answer to a publish: where the stream stored it, or why it did not."""

    seq: int = 0
    duplicate: bool = False
    error: _Refusal | None = None


_ack_decoder = msgspec.json.Decoder(PublishAck)


class Publisher(Protocol):
    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PublishAck]:
        """Send now; the future holds the stream's ack, or the error it answered."""


class AckedPublisher:
    """Publishes whose acks come back on one subscription, each as its publish's future.

    A request per publish (nats-py's `publish`) costs a future, a timer and a task around each
    message; and nats-py's `publish_async` loses a refusal (its reply handler raises the API error
    instead of setting it on the future, which then waits out the relay's timeout).
    """

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._inbox = nc.new_inbox()
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[PublishAck]] = {}
        self._subscribed = False

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PublishAck]:
        if not self._subscribed:
            await self._nc.subscribe(f"{self._inbox}.*", cb=self._answer)
            self._subscribed = True
        token = str(next(self._tokens))
        ack: asyncio.Future[PublishAck] = asyncio.get_running_loop().create_future()
        self._waiting[token] = ack
        ack.add_done_callback(lambda _: self._waiting.pop(token, None))  # answered, or given up on
        await self._nc.publish(subject, payload, reply=f"{self._inbox}.{token}", headers=headers)
        return ack

    async def _answer(self, message: Msg) -> None:
        ack = self._waiting.get(message.subject.rpartition(".")[2])
        if ack is None or ack.done():
            return
        if not message.data and (message.headers or {}).get(api.Header.STATUS) == api.StatusCode.SERVICE_UNAVAILABLE:
            ack.set_exception(NoStreamResponseError())
            return
        try:
            answer = _ack_decoder.decode(message.data)
        except msgspec.DecodeError:
            ack.set_exception(APIError(description="the stream answered a publish with something else than an ack"))
            return
        if answer.error is not None:
            refusal = answer.error
            ack.set_exception(APIError(code=refusal.code, err_code=refusal.err_code, description=refusal.description))
        else:
            ack.set_result(answer)


class OutboxRelay:
    def __init__(
        self,
        js: JetStreamContext,
        publisher: Publisher,
        read_page: PageReader,
        read_notifications: NotificationReader,
        poll_seconds: float = 1.0,
        *,
        health: BusHealth | None = None,
    ) -> None:
        """`publisher`: how the log's messages go out (an AckedPublisher on `js`'s connection).
        `health`: where the relay reports the bus away and back, shared with the service's other loops."""
        self._js = js
        self._publisher = publisher
        self._bus = (health or BusHealth()).retry("relay")
        self._read_page = read_page
        self._read_notifications = read_notifications
        self._poll_seconds = poll_seconds
        self._wakeup = asyncio.Event()
        self.position = 0  # the notification id of the stream's last message the store wrote
        # The stream's last sequence when the relay last looked, and how many messages it held up to
        # there: all of them the store's, in order, ending with `position`.
        self._sequence = 0
        self._held = 0
        self._still_leased: Callable[[], Awaitable[bool]] | None = None
        self.caught_up = asyncio.Event()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self, still_leased: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Relay for ever; `still_leased`: whether this replica holds the relay lease now, asked
        before each heal and each window (the lease's loop cancels this run once it sees it lost)."""
        self._still_leased = still_leased
        while True:
            try:
                await self._fenced()
                await self._heal()
                await self._relay()
            except StreamMoved:
                continue
            except LeaseLost:
                await asyncio.sleep(self._poll_seconds)
            except (TimeoutError, NatsError) as ambiguous:
                # Stored or not, we cannot tell: the stream knows, and the next heal reads it.
                await self._bus.pause(ambiguous)

    async def _relay(self) -> None:
        while True:
            self._wakeup.clear()
            page = await self._read_page(self.position)
            for start in range(0, len(page), WINDOW):
                await self._fenced()
                await self._publish(page[start : start + WINDOW])
            self._bus.succeeded()  # only now: a stream that is read but refuses every publish is no success
            if not page:
                self.caught_up.set()
                await self._idle()

    async def _idle(self) -> None:
        try:
            await asyncio.wait_for(self._wakeup.wait(), self._poll_seconds)
        except TimeoutError:
            # A message someone else stored would otherwise sit at the tail until the next event.
            if (await self._stream_state()).last_seq != self._sequence:
                raise StreamMoved from None

    async def _fenced(self) -> None:
        if self._still_leased is not None and not await self._still_leased():
            raise LeaseLost

    async def _publish(self, window: list[LoggedDocument]) -> None:
        """Publish the window in order, each message naming the sequence it must follow, and take
        the acks in order: the position moves only over messages the stream stored one after another."""
        published = []
        for place, logged in enumerate(window):
            headers = {
                "Nats-Msg-Id": f"bb:{logged.notification_id}:{secrets.token_hex(8)}",
                subjects.NOTIFICATION_HEADER: str(logged.notification_id),
                "Nats-Expected-Last-Sequence": str(self._sequence + place),
            }
            try:
                # Sent in the window's order; their acks are awaited together.
                published.append(await self._publisher.publish_async(logged.subject, logged.payload(), headers))
            except BaseException:
                for sent in published:  # nobody will wait for their acks now
                    sent.cancel()
                raise
        # Given up on (a timeout, a cancellation), the gather cancels the acks still out.
        acks = await asyncio.wait_for(asyncio.gather(*published, return_exceptions=True), PUBLISH_TIMEOUT_S)
        for place, (logged, ack) in enumerate(zip(window, acks)):
            if isinstance(ack, BaseException) or ack.duplicate:  # a duplicate: the stream kept another message
                await self._after_a_miss(window[place:], acks[place:])
                if (
                    not isinstance(ack, BaseException)
                    or isinstance(ack, APIError)
                    and ack.err_code == WRONG_LAST_SEQUENCE
                ):
                    raise StreamMoved
                raise ack
            crash_point("relay-published")
            self.position, self._sequence, self._held = logged.notification_id, ack.seq, self._held + 1

    async def _after_a_miss(self, rest: list[LoggedDocument], acks: list[PublishAck | BaseException]) -> None:
        """`rest[0]` was not stored: keep each later message of the window the stream stored only
        if it follows the store's message it should (another relay's copy of `rest[0]`, say);
        from the first that does not, delete them all."""
        stored_at: int | None = None  # where the message before this one was stored by this window
        for place, ack in enumerate(acks[: len(rest)]):
            if isinstance(ack, BaseException) or ack.duplicate:
                stored_at = None
                continue
            if place and stored_at != ack.seq - 1 and not await self._holds(ack.seq - 1, rest[place - 1]):
                out_of_place = [a.seq for a in acks[place:] if not isinstance(a, BaseException) and not a.duplicate]
                for sequence in out_of_place:
                    with contextlib.suppress(NotFoundError):
                        await self._js.delete_msg(subjects.ENVIRONMENTS_STREAM, sequence)
                log.warning(
                    "relay deleted %d message(s) it published after a message the event store did not "
                    "write (%s); they are published again in place",
                    len(out_of_place),
                    _span(out_of_place),
                )
                return
            stored_at = ack.seq

    async def _holds(self, sequence: int, logged: LoggedDocument) -> bool:
        """Whether the stream's message at `sequence` is exactly `logged`."""
        message = await self._message_at(sequence)
        return (
            message is not None
            and message.subject is not None
            and subjects.claimed_notification_id(message.headers) == logged.notification_id
            and logged.matches(message.subject, message.data)
        )

    async def _heal(self) -> None:
        """Make the stream end with its last message the store wrote, and go on from there."""
        state = await self._stream_state()
        position, held, foreign = await self._last_written(state)
        for sequence in foreign:
            try:
                await self._js.delete_msg(subjects.ENVIRONMENTS_STREAM, sequence)
            except NotFoundError:
                pass
        if foreign:
            log.warning(
                "relay deleted %d stream message(s) the event store did not write (%s); "
                "the stream goes on after notification %d",
                len(foreign),
                _span(foreign),
                position,
            )
        # Deleting does not lower the stream's last sequence: the next publish expects the snapshot's.
        self.position, self._sequence, self._held = position, state.last_seq, held

    async def _last_written(self, state: api.StreamState) -> tuple[int, int, list[int]]:
        """Walking back from the tail: the notification id of the last message the store wrote, how
        many messages the stream holds up to it, and the sequences of the messages after it."""
        sequence, held = state.last_seq, state.messages
        foreign: list[int] = []
        while held and sequence:
            if sequence == self._sequence and held == self._held:
                return self.position, held, foreign  # what the relay checked, untouched since
            at, sequence = sequence, sequence - 1
            message = await self._message_at(at)
            if message is None:
                continue
            written = await self._written(message, held)
            if written is not None:
                return written, held, foreign
            foreign.append(at)
            held -= 1
        return 0, 0, foreign

    async def _written(self, message: api.RawStreamMsg, held: int) -> int | None:
        """The notification id of `message` if the store wrote exactly it, as the stream's `held`th message."""
        claimed = subjects.claimed_notification_id(message.headers)
        # Ids start at 1 and never repeat, so notification n is at most the stream's nth message:
        # a copy of an older message, sent again later, gives itself away by its place.
        if claimed is None or claimed < held:
            return None
        logged = (await self._read_notifications([claimed])).get(claimed)
        matches = logged is not None and message.subject is not None and logged.matches(message.subject, message.data)
        return claimed if matches else None

    async def _message_at(self, sequence: int) -> api.RawStreamMsg | None:
        try:
            return await self._js.get_msg(subjects.ENVIRONMENTS_STREAM, sequence)
        except NotFoundError:
            return None

    async def _stream_state(self) -> api.StreamState:
        return (await self._js.stream_info(subjects.ENVIRONMENTS_STREAM)).state


def _span(sequences: list[int]) -> str:
    first, last = min(sequences), max(sequences)
    return f"sequence {first}" if first == last else f"sequences {first} to {last}"
