"""`--wait`: follow an environment's events and stream its transcript to stderr until it reaches one
of the statuses a command waits for, then say how it ended (`thread spawn`, `environment retry` and
`delete`, `thread archive`)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import EnvironmentRef, Request
from bb_environments.bus.wire.service_errors import AnswerLost, ServiceError
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.entrypoints.cli.connection import may_have_taken_effect, open_client, sendable
from bb_environments.entrypoints.cli.support import Failure, Seconds, fitted, stderr
from bb_environments.entrypoints.config import Settings

if TYPE_CHECKING:  # imported by open_client, once the URL is known
    from bb_environments.bus.api_client.nats_client import ApiClient

Ends = Mapping[EnvironmentStatus, int]
"""The statuses a wait stops at, each with the command's exit code when it stops there."""

WAIT_AT_MOST_S = 7 * 24 * 3600.0
"""The longest `--timeout`: beyond a week a wait is a mistake, not a plan."""
SETTLED: Ends = {
    EnvironmentStatus.READY: 0,
    EnvironmentStatus.ERROR: 1,
    EnvironmentStatus.REMOVING: 1,
    EnvironmentStatus.REMOVED: 1,
    EnvironmentStatus.RETIRING: 1,
}
"""Where a new attempt (`thread spawn`, `environment retry`) ends: ready, or failed or gone."""
REMOVED: Ends = {EnvironmentStatus.REMOVED: 0, EnvironmentStatus.ERROR: 1}
"""Where a deletion ends."""
LEFT: Ends = {EnvironmentStatus.REMOVED: 0, EnvironmentStatus.READY: 0, EnvironmentStatus.ERROR: 1}
"""Where an archived thread's environment ends: removed, or kept ready (for its other threads, a
provider that never retires, or the thread unarchived inside the grace)."""

WAIT_FALLBACK_POLL_S = 5.0
"""A wait asks again this often only in case an environment event never reaches it."""
REMEMBERED_LINE_IDS = 100_000
"""A wait shows a transcript line sent again once if it came among this many last lines: a whole
hook's output for most (8 MiB, the most a hook's log keeps, is 100,000 lines of 84 bytes), in
about 15 MB at most."""

F = TypeVar("F", bound=Callable[..., Any])


def wait_options(wait_help: str) -> Callable[[F], F]:
    """--wait and its --timeout, for a command that can follow its environment until it ends."""

    def decorate(command: F) -> F:
        command = click.option(
            "--timeout",
            type=Seconds(longest=WAIT_AT_MOST_S),
            default=900.0,
            show_default=True,
            metavar="SECONDS",
            help="How long --wait waits for the environment, in seconds (exit 5 when it is up).",
        )(command)
        return click.option("--wait", is_flag=True, help=wait_help)(command)

    return decorate


class SettleWatch:
    """What comes from the moment a command is given, subscribed to before it is sent (the
    environment it changes may not be known yet): the environment events that say an environment
    reached one of `ends`, counted and kept, never cleared unseen, even when one comes before the
    command's answer or while a look is under way; and the transcript lines, held until the answer
    names the environment to `follow`, then printed to stderr as they come. Only what is new is
    shown: the transcript before the command is `bb environment logs`'s. A line published again
    under its message id (a hook's output, sent again by a service that restarted under it) is
    shown once, as the stream keeps it once, within the last REMEMBERED_LINE_IDS lines."""

    def __init__(self, ends: Ends = SETTLED) -> None:
        import asyncio  # loaded by now (the command runs on it); only the commands that need it import it

        self.ends = ends
        self.arrived: dict[str, int] = {}  # environment id -> ending events seen
        self.settled_at: dict[str, int] = {}  # environment id -> the latest one's log position
        self.news = asyncio.Event()
        self._subscriptions: list[Any] = []
        self._held: dict[str, list[bytes]] = {}  # environment id -> its lines until one is followed
        self._line_ids: set[str] = set()  # the message ids of the lines come lately...
        self._line_ids_in_order: deque[str] = deque()  # ...oldest first, to forget past the bound
        self._followed: str | None = None

    async def start(self, client: ApiClient) -> None:
        self._subscriptions = [
            await client.nc.subscribe(subjects.environment_event("*", "*"), cb=self._on_event),
            await client.nc.subscribe(subjects.transcript("*"), cb=self._on_line),
        ]

    def follow(self, environment_id: str) -> None:
        """Print the lines of `environment_id` held so far, then each as it comes; forget the others'."""
        self._followed = environment_id
        for data in self._held.pop(environment_id, []):
            _print_line(data)
        self._held.clear()

    async def stop(self) -> None:
        from nats.errors import Error as NatsError  # imported by now: see connection._client_for

        for subscription in self._subscriptions:
            with contextlib.suppress(NatsError):  # with the connection gone there is nothing to unsubscribe
                await subscription.unsubscribe()
        self._subscriptions = []

    async def _on_event(self, message: Any) -> None:
        environment_id = message.subject.split(".")[2]
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if json.loads(message.data)["status"] in self.ends:
                self.arrived[environment_id] = self.arrived.get(environment_id, 0) + 1
                # The stream re-publishes the log's headers, the event's log position among them.
                self.settled_at[environment_id] = max(
                    self.settled_at.get(environment_id, 0), subjects.claimed_notification_id(message.headers) or 0
                )
                self.news.set()

    async def _on_line(self, message: Any) -> None:
        line_id = (message.headers or {}).get("Nats-Msg-Id")
        if line_id is not None:
            if line_id in self._line_ids:
                return
            self._line_ids.add(line_id)
            self._line_ids_in_order.append(line_id)
            if len(self._line_ids_in_order) > REMEMBERED_LINE_IDS:
                self._line_ids.discard(self._line_ids_in_order.popleft())
        environment_id = message.subject.removeprefix(subjects.transcript(""))
        if self._followed is None:
            self._held.setdefault(environment_id, []).append(message.data)
        elif environment_id == self._followed:
            _print_line(message.data)


def _print_line(data: bytes) -> None:
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):  # not a line of ours: not shown
        line = json.loads(data)
        stderr.print(fitted("» " if line["kind"] == "step" else "  ", line["text"], stream=sys.stderr), markup=False)


async def wait_until_settled(
    client: ApiClient, watch: SettleWatch, environment_id: str, position: int, timeout: float
) -> dict[str, Any]:
    """Stream the transcript to stderr, from when `watch` started, until the environment reaches
    one of `watch.ends`.

    Returns as soon as an event says so (`watch` has followed the events since before the
    command); the look after such an event waits for the read model to reach that event's log
    position. The slow poll is only a safety net. A wait that outlasts `timeout` ends with
    `timed_out` (exit 5): the environment goes on, it has not failed.
    """
    import asyncio

    watch.follow(environment_id)
    deadline = time.monotonic() + timeout
    looked = 0  # the ending events that had arrived before the last look
    current = await client.call(
        "environments", "show", EnvironmentRef(environment_id=environment_id, min_position=position)
    )
    while current["status"] not in watch.ends:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Failure(
                "timed_out", f"environment {environment_id} was still {current['status']} after {timeout:.0f} s"
            )
        if watch.arrived.get(environment_id, 0) == looked:  # none since the last look (no await between)
            watch.news.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(watch.news.wait(), min(remaining, WAIT_FALLBACK_POLL_S))
        looked = watch.arrived.get(environment_id, 0)
        current = await _look(client, environment_id, max(position, watch.settled_at.get(environment_id, 0)), position)
    return current


async def _look(client: ApiClient, environment_id: str, claimed: int, known: int) -> dict[str, Any]:
    """`show` once the read model reached the position an event claimed; a message the log never
    wrote (a forgery, were the bus's permissions off) may claim one past the log's end, which the
    service refuses: then the position the command's own answer gave is what counts."""
    try:
        return await client.call(
            "environments", "show", EnvironmentRef(environment_id=environment_id, min_position=claimed)
        )
    except ServiceError as refused:
        if refused.code != "invalid_input" or claimed == known:
            raise
        return await client.call(
            "environments", "show", EnvironmentRef(environment_id=environment_id, min_position=known)
        )


def lost(message: str, **ids: str) -> Failure:
    """Unreachable, with what the caller needs to find the command's work again in the error document too."""
    return Failure("unreachable", message, {"error": {"code": "unreachable", "message": message, **ids}})


def emit_ended(document: dict[str, Any], ends: Ends, as_json: bool, human: Callable[[dict[str, Any]], None]) -> None:
    """Print how a wait ended. One that ended where its command did not mean to go (an attempt
    that failed, say) fails the command, the document printed all the same: for a person first,
    with --json by the failure."""
    if not as_json:
        human(document)
    if document["environmentId"] is not None and ends.get(document["status"], 1):  # None: nothing was followed
        raise Failure(
            "failed",
            f"environment {document['environmentId']} ended {document['status']}: "
            f"{document.get('statusMessage') or 'no message'}",
            document,
        )
    if as_json:
        print(json.dumps(document))


async def change_and_wait(
    settings: Settings, area: str, verb: str, request: Request, ends: Ends, timeout: float
) -> dict[str, Any]:
    """Send a command that changes an environment, then follow the environment until it reaches
    one of `ends`: the command's answer, its status the one it reached (and the message of that),
    for `emit_ended`."""
    sendable(request)
    client = await open_client(settings)
    from nats.errors import Error as NatsError  # nats-py is imported once the URL is known: see connection._client_for

    watch = SettleWatch(ends)
    try:
        await watch.start(client)
        try:
            accepted = await client.call(area, verb, request)
        except AnswerLost as answer_lost:
            raise may_have_taken_effect(answer_lost) from None
        document = {"environmentId": accepted["environmentId"], "status": accepted["status"]}
        if accepted["environmentId"] is None:
            return document  # nothing to follow: no environment changed
        try:
            final = await wait_until_settled(client, watch, accepted["environmentId"], accepted["position"], timeout)
        except (ServiceError, NatsError) as gone:
            if isinstance(gone, ServiceError) and gone.code != "unreachable":
                raise
            raise lost(
                f"lost the bb service while waiting for environment {accepted['environmentId']}; the "
                f"environment goes on without this command: `bb environment show {accepted['environmentId']}` "
                "follows it once the service is back",
                environmentId=accepted["environmentId"],
            ) from None
        document.update(status=final["status"], statusMessage=final.get("statusMessage"))
    finally:
        await watch.stop()
        await client.close()
    return document
