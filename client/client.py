"""The typed client (SPEC section 8.1): publish a thread's events, hear where it stands, follow
its environment. A service that integrates with bb needs nothing else; it needs no seed but the
publisher's, and what it is sent back are the wire's own msgspec structs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import uuid4

import msgspec
from nats.aio.client import Client as Nats
from nats.errors import Error as NatsError
from nats.js import api

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.documents import EnvironmentDocument, EnvironmentEvent
from bb_environments.bus.wire.placements import PlacementOutcome
from bb_environments.bus.wire.resending import NOBODY_TOOK_IT, sent_until_answered
from bb_environments.bus.wire.server_file import (
    SERVER_FILE,
    DataDirError,
    ServerFileError,
    data_root,
    nats_servers,
    read_server_file,
)
from bb_environments.bus.wire.thread_events import (
    InboundThreadMessage,
    Machine,
    ProviderIntent,
    ThreadArchivedMessage,
    ThreadCreatedMessage,
    ThreadMessageMessage,
)
from bb_environments.bus.wire.transcript_lines import TranscriptLine
from bb_environments.client import streams
from bb_environments.client.errors import (
    EnvironmentFailed,
    InvalidId,
    PlacementRefused,
    PlacementTimedOut,
    ServiceNotFound,
    ServiceUnavailable,
)
from bb_environments.domain.ids import HOST_ID_PATTERN, HOST_ID_RULE, ID_PATTERN, ID_RULE, quoted

T = TypeVar("T")

CONNECT_WITHIN_S = 10.0
"""How long `connect` tries before it says the service cannot be reached."""
SEND_WITHIN_S = 60.0
"""How long a thread event is sent again (bus/wire/resending.py: each attempt has seconds) before
ServiceUnavailable: a restart of the service, a cluster electing a stream's leader, take less."""


_outcome = msgspec.json.Decoder(PlacementOutcome)
_event: msgspec.json.Decoder[EnvironmentEvent] = msgspec.json.Decoder(EnvironmentDocument)
_line = msgspec.json.Decoder(TranscriptLine)


class Client:
    """A connection to bb as a publisher (or a subscriber, given its seed). It reconnects by
    itself, for as long as it is open: the embedded server keeps its port across restarts."""

    def __init__(self, nc: Nats) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._placed_after: dict[str, int] = {}  # thread id -> BB_PLACEMENTS' last sequence before its spawn

    @classmethod
    async def connect(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        url: str | None = None,
        credentials: str | os.PathLike[str] | None = None,
    ) -> Client:
        """Without `url`, the embedded service of `data_dir` (default: BB_DATA_DIR, else
        ~/.local/share/bb) as its server.json names it, with the publisher's seed unless
        `credentials` names another. `credentials`: a seed file (`.nk`) or a `.creds` file."""
        seed: str | None = str(credentials) if credentials is not None else None
        if url is None:
            try:
                info = read_server_file(os.path.join(data_root(os.fspath(data_dir) if data_dir else None), SERVER_FILE))
            except (ServerFileError, DataDirError) as unusable:
                raise ServiceNotFound(
                    f"cannot find the bb service: {unusable}; is `bb serve` running on that data dir?"
                ) from None
            url = info.nats_url
            if seed is None and info.credentials is not None:
                seed = info.credentials.publisher
        options: dict[str, Any] = {}
        if seed is not None:
            options["user_credentials" if seed.endswith(".creds") else "nkeys_seed"] = seed
        errors: list[str] = []

        async def remember(error: Exception) -> None:
            # The last only: it goes on hearing each failed reconnect for as long as it is open.
            errors[:] = [str(error).removeprefix("nats: ").strip("'") or type(error).__name__]

        nc = Nats()
        try:
            # Reconnecting forever: a client outlives restarts of the service however long they take.
            await asyncio.wait_for(
                nc.connect(nats_servers(url), max_reconnect_attempts=-1, error_cb=remember, **options), CONNECT_WITHIN_S
            )
        except (TimeoutError, NatsError, OSError):
            await nc.close()
            said = f": {errors[-1]}" if errors else ""
            raise ServiceNotFound(f"cannot connect to the bb service at {url}{said}") from None
        return cls(nc)

    async def spawn(
        self,
        thread_id: str,
        *,
        provider: str,
        project: str | os.PathLike[str] | None = None,
        inputs: Any = None,
        host: str | None = None,
        prompt: str | None = None,
    ) -> None:
        """Publish the thread's `created` (an environment of `provider` with `inputs`, on `host`)
        and its first `message` (`prompt`), each once JetStream has stored it. Where the thread
        then stands comes as its placement outcome: see `wait_ready`.

        Safe to call again with the same thread id (after a ServiceUnavailable, say): a thread is
        placed once, and a spawn of a thread placed already changes nothing; `wait_ready` then
        returns the outcome it had. Each event is sent again while unanswered (the stream keeps it
        once) until SEND_WITHIN_S; then ServiceUnavailable. InvalidId, before anything is sent,
        for a thread or host id the service does not allow."""
        _check(thread_id, "thread id", _THREAD_ID, ID_RULE)
        if host is not None:
            _check(host, "host id", _HOST_ID, HOST_ID_RULE)
        info = await self._answered(
            lambda wait: self._js.stream_info(subjects.PLACEMENTS_STREAM), f"the stream {subjects.PLACEMENTS_STREAM}"
        )
        self._placed_after[thread_id] = info.state.last_seq
        intent = ProviderIntent(
            environment_provider_id=provider, inputs=inputs, machine=Machine(host_id=host) if host is not None else None
        )
        await self._publish(
            ThreadCreatedMessage(
                thread_id=thread_id,
                occurred_at=_now(),
                environment=intent,
                project_path=os.fspath(project) if project is not None else None,
            )
        )
        await self._publish(ThreadMessageMessage(thread_id=thread_id, occurred_at=_now(), text=prompt))

    async def archive(self, thread_id: str) -> None:
        """Publish that the thread was archived: its environment retires once no live thread uses it.
        Safe to call again: archiving an archived thread changes nothing. Sent again and raising
        as `spawn` does."""
        _check(thread_id, "thread id", _THREAD_ID, ID_RULE)
        await self._publish(ThreadArchivedMessage(thread_id=thread_id, occurred_at=_now()))

    async def wait_ready(self, thread_id: str, *, timeout: float) -> PlacementOutcome:
        """The thread's placement outcome once it is `ready`; PlacementRefused or EnvironmentFailed
        (naming the reason) when it is `refused` or `error`, PlacementTimedOut (a TimeoutError)
        after `timeout` seconds.

        An outcome published before this was called counts: the thread's outcomes are read from
        the stream. After a spawn by this client: the first outcome after it, or, when the thread
        had been placed before that spawn (a spawn sent again), the outcome it had; else the
        newest there is (or the next to come)."""
        try:
            return await asyncio.wait_for(self._settled(thread_id, self._placed_after.get(thread_id)), timeout)
        except TimeoutError:
            raise PlacementTimedOut(f"thread {thread_id} heard no placement outcome within {timeout:g} s") from None

    async def placements(
        self, thread_id: str | None = None, *, history: bool = False
    ) -> AsyncGenerator[PlacementOutcome, None]:
        """Placement outcomes as they come (of one thread, or of every thread): those published
        from now on, or with `history` every one the stream keeps (a week's) first. Each once,
        in the order they were published, also across a restart of the service."""
        subject = subjects.placement(thread_id or "*", "*")
        deliver = api.DeliverPolicy.ALL if history else api.DeliverPolicy.NEW
        async with contextlib.aclosing(
            streams.follow(self._nc, subjects.PLACEMENTS_STREAM, subject, deliver)
        ) as messages:
            async for message in messages:
                yield _outcome.decode(message.data)

    async def environment_events(
        self, environment_id: str, *, follow: bool = True
    ) -> AsyncGenerator[EnvironmentEvent, None]:
        """The environment's events from its first, in order, then as they happen until it is
        `removed` (with `follow=False`, only those recorded so far)."""
        subject = subjects.log_event("environment", environment_id, ">")
        reader = streams.follow(
            self._nc, subjects.ENVIRONMENTS_STREAM, subject, api.DeliverPolicy.ALL, until_caught_up=not follow
        )
        async with contextlib.aclosing(reader) as messages:
            async for message in messages:
                event = _event.decode(message.data)
                yield event
                if event.type == "removed":
                    return

    async def transcript(self, environment_id: str, *, follow: bool = False) -> AsyncGenerator[TranscriptLine, None]:
        """The environment's transcript as the stream keeps it (its last 2000 lines), then, with
        `follow`, each line as it is written, until the caller stops reading."""
        reader = streams.follow(
            self._nc,
            subjects.TRANSCRIPTS_STREAM,
            subjects.transcript(environment_id),
            api.DeliverPolicy.ALL,
            until_caught_up=not follow,
        )
        async with contextlib.aclosing(reader) as messages:
            async for message in messages:
                yield _line.decode(message.data)

    async def close(self) -> None:
        await self._nc.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _settled(self, thread_id: str, spawned_after: int | None) -> PlacementOutcome:
        subject = subjects.placement(thread_id, "*")
        outcome = None
        if spawned_after is not None:
            # Placed before this client's spawn, and not refused: the spawn changed nothing, and no
            # outcome follows it. Else the first outcome after it is its answer (a refused
            # `created` comes before the refusal of the `message` that followed it).
            before = await self._newest(subject, until_caught_up=True)
            if before is not None and before.outcome.status != "refused" and before.sequence <= spawned_after:
                outcome = before.outcome
            else:
                reader = streams.follow(
                    self._nc,
                    subjects.PLACEMENTS_STREAM,
                    subject,
                    api.DeliverPolicy.ALL,
                    start_sequence=spawned_after + 1,
                )
                async with contextlib.aclosing(reader) as messages:
                    async for message in messages:
                        outcome = _outcome.decode(message.data)
                        break
        else:
            newest = await self._newest(subject, until_caught_up=False)
            outcome = newest.outcome if newest is not None else None
        assert outcome is not None  # a reader that is not caught up only ends with a message
        self._placed_after.pop(thread_id, None)  # answered: from now on its newest outcome counts
        if outcome.status == "refused":
            raise PlacementRefused(outcome)
        if outcome.status == "error":
            raise EnvironmentFailed(outcome)
        return outcome

    async def _newest(self, subject: str, until_caught_up: bool) -> _Stored | None:
        """The newest outcome on `subject` the stream holds (None: none, when `until_caught_up`),
        else the next to come."""
        reader = streams.follow(
            self._nc,
            subjects.PLACEMENTS_STREAM,
            subject,
            api.DeliverPolicy.LAST_PER_SUBJECT,
            until_caught_up=until_caught_up,
        )
        async with contextlib.aclosing(reader) as messages:
            async for message in messages:
                # The last of each kind that was stored come first, in order: the newest of them counts.
                if message.metadata.num_pending == 0:
                    return _Stored(message.metadata.sequence.stream, _outcome.decode(message.data))
        return None

    async def _publish(self, event: InboundThreadMessage) -> None:
        subject = subjects.thread_event(event.thread_id, str(type(event).__struct_config__.tag))
        payload = msgspec.json.encode(event)
        # Each attempt is this one publish: the stream keeps one of them, however many it took.
        headers = {"Nats-Msg-Id": f"{event.thread_id}:{uuid4().hex}"}
        await self._answered(
            lambda wait: self._js.publish(
                subject, payload, timeout=wait, stream=subjects.THREADS_STREAM, headers=headers
            ),
            f"thread {event.thread_id}'s event",
        )

    async def _answered(self, attempt: Callable[[float], Awaitable[T]], what: str) -> T:
        """`attempt`'s answer, sent again while unanswered (bus/wire/resending.py), or ServiceUnavailable."""
        try:
            return await sent_until_answered(attempt, timeout=SEND_WITHIN_S)
        except (TimeoutError, *NOBODY_TOOK_IT):
            raise ServiceUnavailable(
                f"the bb service took no message for {what} within {SEND_WITHIN_S:g} s; "
                "it is down or restarting: sending it again is safe"
            ) from None
        except NatsError as error:
            raise ServiceUnavailable(
                f"the connection to the bb service failed ({type(error).__name__}) before "
                f"it took {what}; sending it again is safe"
            ) from None


class _Stored(msgspec.Struct):
    sequence: int
    outcome: PlacementOutcome


_THREAD_ID = re.compile(ID_PATTERN)
_HOST_ID = re.compile(HOST_ID_PATTERN)


def _check(value: str, what: str, pattern: re.Pattern[str], rule: str) -> None:
    """As the service checks it: an id it would refuse is the caller's to fix, and is never sent."""
    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidId(f"{what} {quoted(str(value))} is not allowed: use {rule}")


def _now() -> datetime:
    return datetime.now(UTC)
