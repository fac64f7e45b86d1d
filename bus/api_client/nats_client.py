"""The caller's side of the API: find the running service, send a request, decode the answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, TypeVar, Unpack

import msgspec
from nats.aio.client import NO_RESPONDERS_STATUS, Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api

from bb_environments.bus.health import describe
from bb_environments.bus.jetstream import ConnectOptions
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import LONG_WORK, Request, decode_answer
from bb_environments.bus.wire.resending import ATTEMPT_S, sent_until_answered
from bb_environments.bus.wire.server_file import nats_servers
from bb_environments.bus.wire.service_errors import (
    REFUSED_HINT,
    SERVICE_CHECK_S,
    AnswerLost,
    ServiceError,
    refused_request,
    unreachable,
)
from bb_environments.providers.host.processes import pid_alive

T = TypeVar("T")

READER_IDLE_S = 30.0
"""How soon the server drops a stream reader's consumer after its client stopped asking."""
READER_BATCH = 256


class ApiClient:
    def __init__(self, nc: Client, service_pid: int | None = None) -> None:
        """`service_pid`: the service's process, when it runs on this machine (the embedded default)."""
        self.nc = nc
        self._service_pid = service_pid
        self._next_drop = asyncio.Event()
        self._closed = asyncio.Event()
        self._violations: list[str] = []

    @classmethod
    async def connect(
        cls, url: str, data_dir: str | None = None, service_pid: int | None = None, **options: Unpack[ConnectOptions]
    ) -> ApiClient:
        errors: list[Exception] = []

        async def remember(error: Exception) -> None:
            errors.append(error)
            client._note(error)

        client = cls(Client(), service_pid)
        try:
            # nats-py annotates reconnect_time_wait as int, but only sleeps for it.
            await client.nc.connect(
                nats_servers(url),
                connect_timeout=2,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,  # type: ignore[arg-type]
                error_cb=remember,
                disconnected_cb=client._dropped,
                closed_cb=client._ended,
                **options,
            )
        except (NoServersError, OSError, NatsTimeout, NatsError) as error:
            # A refusal of our credentials ('Authorization Violation') reaches only the error callback
            # once the client has given up on the server: name it rather than the giving up.
            refused = next((e for e in errors if "violation" in str(e).lower()), None)
            if refused is not None or (isinstance(error, NatsError) and "violation" in str(error).lower()):
                reason = str(refused or error).removeprefix("nats: ").strip("'")
                raise unreachable(f"{url} refused the connection: {reason}", data_dir) from None
            raise unreachable(f"cannot connect to {url}: {type(error).__name__}", data_dir) from None
        return client

    async def call(self, area: str, verb: str, body: Request, timeout: float = 60) -> dict[str, Any]:
        """The service's answer, the request sent again to the API's queue group each time an
        attempt goes unanswered (bus/wire/resending.py) until `timeout` seconds have passed: a
        replica killed or stopped with the request never answers it, another one does. Whatever
        replica answers first is heard, one that was only slow too. LONG_WORK is sent once."""
        what, subject = f"{area} {verb}", subjects.api(area, verb)
        payload = msgspec.json.encode(body)
        inbox = self.nc.new_inbox()
        answers = await self.nc.subscribe(inbox)

        async def attempt(wait: float) -> Msg:
            await self.nc.publish(subject, payload, reply=inbox)
            answer = await answers.next_msg(timeout=wait)  # raises nats-py's TimeoutError (a TimeoutError)
            if (answer.headers or {}).get(api.Header.STATUS) == NO_RESPONDERS_STATUS:
                raise NoRespondersError
            return answer

        try:
            attempt_s = timeout if (area, verb) in LONG_WORK else ATTEMPT_S
            reply = await self._unless_lost(
                sent_until_answered(attempt, timeout=timeout, attempt_s=attempt_s, until=self._service_may_live),
                subject,
                what,
            )
        except NoRespondersError:
            raise unreachable("nothing answers the API") from None
        except NatsTimeout:
            raise AnswerLost(f"the bb service did not answer {what} within {timeout:.0f} s") from None
        except NatsError as error:  # the connection is closed or its buffer full: the request never left
            raise unreachable(f"the connection to it failed: {describe(error)}") from None
        finally:
            with contextlib.suppress(NatsError):  # with the connection gone there is nothing to unsubscribe
                await answers.unsubscribe()
        return decode_answer(reply.headers or {}, reply.data)

    async def read_stream(self, stream: str, subject: str, wait: float) -> AsyncGenerator[list[Msg], None]:
        """`subject`'s messages in `stream` from the start, a batch at a time as they are stored,
        an empty batch after `wait` seconds without one. Read by a pull consumer of this client's
        own, created by name and filter, the one way a client's permissions allow (bus/access.py)."""
        reader = await self.nc.jetstream().pull_subscribe(
            subject,
            stream=stream,
            config=api.ConsumerConfig(
                ack_policy=api.AckPolicy.NONE, inactive_threshold=READER_IDLE_S, mem_storage=True
            ),
        )
        try:
            while True:
                try:
                    yield await reader.fetch(READER_BATCH, timeout=wait)
                except TimeoutError:  # nats-py's own, or asyncio's when its deadline passes between two pulls
                    yield []
        finally:
            with contextlib.suppress(NatsError):  # with the connection gone there is nothing to unsubscribe
                await reader.unsubscribe()

    async def until_closed(self) -> None:
        """Return once the connection is gone for good (it tries once to reconnect)."""
        await self._closed.wait()

    async def close(self) -> None:
        await self.nc.close()

    async def _unless_lost(self, request: Awaitable[T], subject: str, what: str) -> T:
        """`request`'s result, unless its answer can no longer come: the server refused to pass the
        request on `subject` or its answer, a dropped connection to the embedded server took it
        along, or the service's process ended. Waiting out the timeout would only end in the same doubt, a minute later."""
        answer = asyncio.ensure_future(request)
        # Taken however it ends: nats-py ends a wait cancelled on a closed connection with an error
        # rather than the cancellation, and what made the answer lost says what happened.
        answer.add_done_callback(lambda ended: ended.cancelled() or ended.exception())
        lost = asyncio.ensure_future(self._answer_lost(subject, what))
        try:
            done, _ = await asyncio.wait({answer, lost}, return_when=asyncio.FIRST_COMPLETED)
            if answer in done:
                return answer.result()
            raise lost.result()
        finally:
            answer.cancel()
            lost.cancel()
            await asyncio.wait({answer, lost})  # ended here, not left to the loop's shutdown to report

    def _service_may_live(self) -> bool:
        return self._service_pid is None or pid_alive(self._service_pid)

    async def _answer_lost(self, subject: str, what: str) -> ServiceError:
        # The embedded server's connection drops with its service; a node of a cluster that drops
        # it leaves the client to reconnect to another, where the request is sent again.
        drop = self._next_drop if self._service_pid is not None else asyncio.Event()
        while True:
            try:
                await asyncio.wait_for(drop.wait(), SERVICE_CHECK_S)
                return AnswerLost(f"the connection to the bb service dropped before it answered {what}")
            except TimeoutError:
                if (refused := self._refused(subject, what)) is not None:
                    return refused
                if self._service_pid is not None and not pid_alive(self._service_pid):
                    return AnswerLost(f"the bb service (pid {self._service_pid}) ended before it answered {what}")

    def _note(self, error: Exception) -> None:
        said = str(error).removeprefix("nats: ").strip("'")
        if said.lower().startswith("permissions violation"):
            self._violations.append(said)

    def _refused(self, subject: str, what: str) -> ServiceError | None:
        """What the permissions violations the server reported mean for a request on `subject`: a
        refused publish never reached the service; a refused reply inbox lets none of its answers
        back, though the request went out. A user's permissions hold for its whole connection."""
        for said in self._violations:
            if f'for publish to "{subject}"'.lower() in said.lower():
                return refused_request(f"the NATS server refused the request: {said}")
            if 'for subscription to "_inbox.' in said.lower():
                return AnswerLost(
                    f"the NATS server refuses these credentials their answers ({said}), so the answer to "
                    f"{what} cannot come; {REFUSED_HINT}"
                )
        return None

    async def _dropped(self) -> None:
        # One event per drop: a request waits for a drop after it was sent, not for one the
        # connection recovered from before.
        self._next_drop.set()
        self._next_drop = asyncio.Event()

    async def _ended(self) -> None:
        self._closed.set()
