"""The typed client (SPEC section 8.1): publish a thread's events, hear where it stands, follow
its environment. A service that integrates with bb needs nothing else; it needs no seed but the
publisher's, and what it is sent back are the wire's own msgspec structs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator
from datetime import datetime, timezone
from typing import Any

import msgspec
import nats
from nats.aio.client import Client as Nats
from nats.errors import Error as NatsError
from nats.js import api

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.documents import EnvironmentDocument, EnvironmentEvent
from bb_environments.bus.wire.placements import PlacementOutcome
from bb_environments.bus.wire.resending import resent_while_nobody_takes
from bb_environments.bus.wire.server_file import (
    SERVER_FILE, DataDirError, ServerFileError, data_root, nats_servers, read_server_file)
from bb_environments.bus.wire.thread_events import (
    InboundThreadMessage, Machine, ProviderIntent, ThreadArchivedMessage, ThreadCreatedMessage, ThreadMessageMessage,
)
from bb_environments.bus.wire.transcript_lines import TranscriptLine
from bb_environments.client.errors import EnvironmentFailed, PlacementRefused, ServiceNotFound
from bb_environments.client import streams

CONNECT_WITHIN_S = 10.0
"""How long `connect` tries before it says the service cannot be reached."""


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
    async def connect(cls, data_dir: str | os.PathLike[str] | None = None, url: str | None = None,
                      credentials: str | os.PathLike[str] | None = None) -> Client:
        """Without `url`, the embedded service of `data_dir` (default: BB_DATA_DIR, else
        ~/.local/share/bb) as its server.json names it, with the publisher's seed unless
        `credentials` names another. `credentials`: a seed file (`.nk`) or a `.creds` file."""
        seed: str | None = str(credentials) if credentials is not None else None
        if url is None:
            try:
                info = read_server_file(os.path.join(data_root(os.fspath(data_dir) if data_dir else None), SERVER_FILE))
            except (ServerFileError, DataDirError) as unusable:
                raise ServiceNotFound(f"cannot find the bb service: {unusable}; is `bb serve` running on that "
                                      "data dir?") from None
            url = info.nats_url
            if seed is None and info.credentials is not None:
                seed = info.credentials.publisher
        options: dict[str, Any] = {}
        if seed is not None:
            options["user_credentials" if seed.endswith(".creds") else "nkeys_seed"] = seed
        errors: list[str] = []

        async def remember(error: Exception) -> None:
            errors.append(str(error).removeprefix("nats: ").strip("'") or type(error).__name__)

        nc = Nats()
        try:
            # Reconnecting forever: a client outlives restarts of the service however long they take.
            await asyncio.wait_for(nc.connect(nats_servers(url), max_reconnect_attempts=-1, error_cb=remember, **options),
                                   CONNECT_WITHIN_S)
        except (asyncio.TimeoutError, NatsError, OSError):
            await nc.close()
            said = f": {errors[-1]}" if errors else ""
            raise ServiceNotFound(f"cannot connect to the bb service at {url}{said}") from None
        return cls(nc)

    async def spawn(self, thread_id: str, *, provider: str, project: str | os.PathLike[str] | None = None,
                    inputs: Any = None, host: str | None = None, prompt: str | None = None) -> None:
        """Publish the thread's `created` (an environment of `provider` with `inputs`, on `host`)
        and its first `message` (`prompt`), each once JetStream has stored it. Where the thread
        then stands comes as its placement outcome: see `wait_ready`."""
        self._placed_after[thread_id] = (await self._js.stream_info(subjects.PLACEMENTS_STREAM)).state.last_seq
        intent = ProviderIntent(environment_provider_id=provider, inputs=inputs,
                                machine=Machine(host_id=host) if host is not None else None)
        await self._publish(ThreadCreatedMessage(thread_id=thread_id, occurred_at=_now(), environment=intent,
                                                 project_path=os.fspath(project) if project is not None else None))
        await self._publish(ThreadMessageMessage(thread_id=thread_id, occurred_at=_now(), text=prompt))

    async def archive(self, thread_id: str) -> None:
        """Publish that the thread was archived: its environment retires once no live thread uses it."""
        await self._publish(ThreadArchivedMessage(thread_id=thread_id, occurred_at=_now()))

    async def wait_ready(self, thread_id: str, *, timeout: float) -> PlacementOutcome:
        """The thread's placement outcome once it is `ready`; PlacementRefused or EnvironmentFailed
        (naming the reason) when it is `refused` or `error`, TimeoutError after `timeout` seconds.

        An outcome published before this was called counts: the thread's outcomes are read from
        the stream: the first after its spawn, when this client spawned it, else the newest there
        is (or the next to come)."""
        try:
            return await asyncio.wait_for(self._settled(thread_id, self._placed_after.get(thread_id)), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"thread {thread_id} heard no placement outcome within {timeout:g} s") from None

    async def placements(self, thread_id: str | None = None, *, history: bool = False) -> AsyncGenerator[PlacementOutcome, None]:
        """Placement outcomes as they come (of one thread, or of every thread): those published
        from now on, or with `history` every one the stream keeps (a week's) first. Each once,
        in the order they were published, also across a restart of the service."""
        subject = subjects.placement(thread_id or "*", "*")
        deliver = api.DeliverPolicy.ALL if history else api.DeliverPolicy.NEW
        async with contextlib.aclosing(streams.follow(self._nc, subjects.PLACEMENTS_STREAM, subject, deliver)) as messages:
            async for message in messages:
                yield _outcome.decode(message.data)

    async def environment_events(self, environment_id: str, *, follow: bool = True) -> AsyncGenerator[EnvironmentEvent, None]:
        """The environment's events from its first, in order, then as they happen until it is
        `removed` (with `follow=False`, only those recorded so far)."""
        subject = subjects.log_event("environment", environment_id, ">")
        reader = streams.follow(self._nc, subjects.ENVIRONMENTS_STREAM, subject, api.DeliverPolicy.ALL,
                        until_caught_up=not follow)
        async with contextlib.aclosing(reader) as messages:
            async for message in messages:
                event = _event.decode(message.data)
                yield event
                if event.type == "removed":
                    return

    async def transcript(self, environment_id: str, *, follow: bool = False) -> AsyncGenerator[TranscriptLine, None]:
        """The environment's transcript as the stream keeps it (its last 2000 lines), then, with
        `follow`, each line as it is written, until the caller stops reading."""
        reader = streams.follow(self._nc, subjects.TRANSCRIPTS_STREAM, subjects.transcript(environment_id),
                        api.DeliverPolicy.ALL, until_caught_up=not follow)
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
        # After its spawn here, the first outcome is the answer to it (a refused `created` comes
        # before the refusal of the `message` that followed it); else the newest stored, then what comes.
        subject = subjects.placement(thread_id, "*")
        if spawned_after is not None:
            reader = streams.follow(self._nc, subjects.PLACEMENTS_STREAM, subject, api.DeliverPolicy.ALL,
                                    start_sequence=spawned_after + 1)
        else:
            reader = streams.follow(self._nc, subjects.PLACEMENTS_STREAM, subject, api.DeliverPolicy.LAST_PER_SUBJECT)
        async with contextlib.aclosing(reader) as messages:
            async for message in messages:
                # The last of each kind that was stored come first, in order: the newest of them counts.
                if spawned_after is not None or message.metadata.num_pending == 0:
                    outcome = _outcome.decode(message.data)
                    break
        self._placed_after.pop(thread_id, None)  # answered: from now on its newest outcome counts
        if outcome.status == "refused":
            raise PlacementRefused(outcome)
        if outcome.status == "error":
            raise EnvironmentFailed(outcome)
        return outcome

    async def _publish(self, event: InboundThreadMessage) -> None:
        subject = subjects.thread_event(event.thread_id, str(type(event).__struct_config__.tag))
        payload = msgspec.json.encode(event)
        # A cluster whose node with the stream's leader died answers nobody until it elected another.
        await resent_while_nobody_takes(lambda: self._js.publish(subject, payload, stream=subjects.THREADS_STREAM))


def _now() -> datetime:
    return datetime.now(timezone.utc)
