"""`bb thread`: spawn a thread (and with --wait, follow its environment's events and transcript until
it settles), list, archive, unarchive and cancel threads."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import TYPE_CHECKING, Any

import click

from bb_environments.bus.wire.service_errors import AnswerLost, ServiceError
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import EnvironmentRef, ListThreads, SpawnThread, ThreadRef
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.entrypoints.cli.connection import call, listing, open_client, sendable
from bb_environments.entrypoints.cli.support import (
    Failure, Seconds, emit, environment_id_argument, host_id_argument, id_argument, json_option, print_accepted,
    print_table, run_command, stderr, stdout,
)
from bb_environments.entrypoints.config import Settings

if TYPE_CHECKING:  # imported by open_client, once the URL is known
    from bb_environments.bus.api_client.nats_client import ApiClient

WAIT_AT_MOST_S = 7 * 24 * 3600.0
"""The longest `thread spawn --timeout`: beyond a week a wait is a mistake, not a plan."""
TERMINAL_FOR_WAIT = {
    EnvironmentStatus.READY: 0, EnvironmentStatus.ERROR: 1, EnvironmentStatus.REMOVING: 1, EnvironmentStatus.REMOVED: 1,
    EnvironmentStatus.RETIRING: 1,
}
"""The statuses `thread spawn --wait` stops at, with its exit code for each."""


@click.group("thread")
def thread_group() -> None:
    """Spawn and manage threads."""


@thread_group.command("spawn")
@click.option("--environment-provider", "provider")
@click.option("--environment-inputs", "inputs_text")
@click.option("--environment", "environment_id")
@click.option("--project")
@click.option("--thread-id")
@click.option("--parent")
@click.option("--host")
@click.option("--prompt", help="The thread's first message, published on bb.threads.<T>.message for the agent that runs it.")
@click.option("--wait", is_flag=True, help="Stream progress to stderr until the environment is ready or failed.")
@click.option("--timeout", type=Seconds(longest=WAIT_AT_MOST_S), default=900.0, show_default=True, metavar="SECONDS",
              help="How long --wait waits for the environment, in seconds.")
@json_option
@click.pass_obj
@run_command
async def thread_spawn(settings: Settings, provider: str | None, inputs_text: str | None, environment_id: str | None,
                       project: str | None, thread_id: str | None, parent: str | None, host: str | None,
                       prompt: str | None, wait: bool, timeout: float, as_json: bool) -> None:
    """Create a thread and give it an environment."""
    if inputs_text is not None and provider is None:
        raise Failure("invalid_input", "--environment-inputs needs --environment-provider")
    inputs = _parse_inputs(inputs_text)
    for what, value in (("thread id", thread_id), ("parent thread id", parent)):
        if value is not None:  # an empty one too: `--thread-id "$UNSET"` is a mistake, not "pick one"
            id_argument(what, value)
    if host is not None:
        host_id_argument(host)
    # Named here rather than by the service, so that a spawn whose answer was lost can be looked up,
    # and sent again as it is: the service answers a repeated spawn as it answered the first.
    from uuid import uuid4

    thread_id = thread_id or f"t-{uuid4().hex[:16]}"
    request = SpawnThread(
        thread_id=thread_id, environment_provider=provider, environment_inputs=inputs,
        environment_id=environment_id_argument(environment_id) if environment_id is not None else None,
        project_path=os.path.abspath(project) if project else None, host_id=host,
        parent_thread_id=parent, prompt=prompt,
    )
    sendable(request)
    client = await open_client(settings)
    from nats.errors import Error as NatsError  # nats-py is imported once the URL is known: see connection._client_for

    watch = _SettleWatch()
    try:
        if wait:
            await watch.start(client)
        try:
            spawned = await client.call("threads", "spawn", request)
        except AnswerLost as lost:
            raise _lost(f"{lost.message}; thread {thread_id} may have been spawned all the same: `bb thread list` "
                        f"shows it once the service is back, and the same spawn with --thread-id {thread_id} is "
                        "answered for it rather than spawned twice", threadId=thread_id) from None
        document = {"threadId": spawned["threadId"], "environmentId": spawned["environmentId"], "status": spawned["status"]}
        if wait and spawned["environmentId"]:
            try:
                final = await _wait_until_settled(client, watch, spawned["environmentId"], spawned["position"],
                                                  timeout)
            except (ServiceError, NatsError) as lost:
                if isinstance(lost, ServiceError) and lost.code != "unreachable":
                    raise
                raise _lost(f"lost the bb service while waiting for environment {spawned['environmentId']} of "
                            f"thread {thread_id}; the environment goes on without this command: "
                            f"`bb environment show {spawned['environmentId']}` follows it once the service is back",
                            threadId=thread_id, environmentId=spawned["environmentId"]) from None
            document["status"] = final["status"]
            document["statusMessage"] = final.get("statusMessage")
    finally:
        await watch.stop()
        await client.close()
    if wait and TERMINAL_FOR_WAIT.get(document["status"], 1):
        raise Failure("failed", f"environment {document['environmentId']} ended {document['status']}: "
                                f"{document.get('statusMessage') or 'no message'}", document)
    emit(document, as_json, lambda d: stdout.print(f"{d['threadId']}  {d['environmentId']}  {d['status']}", markup=False))


def _lost(message: str, **ids: str) -> Failure:
    """Unreachable, with what the caller needs to find the spawn again in the error document too."""
    return Failure("unreachable", message, {"error": {"code": "unreachable", "message": message, **ids}})


def _parse_inputs(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_number)
    except json.JSONDecodeError as bad:
        raise Failure("invalid_input", f"--environment-inputs is not valid JSON: {bad}") from None
    except RecursionError:
        # The service refuses inputs nested deeper than a few dozen levels; these cannot even be read.
        raise Failure("invalid_input", "--environment-inputs nests objects and arrays too deeply to be read; "
                                       "provider inputs need a few levels at most") from None


def _refuse_constant(name: str) -> float:
    # Python's json reads NaN and Infinity, which JSON has not: the bus would carry them as null.
    raise Failure("invalid_input", f"--environment-inputs contains {name}, which is not a JSON number; "
                                   "use a finite number or a string")


def _finite_number(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise Failure("invalid_input", f"--environment-inputs contains the number {text}, which is too large "
                                       "for a JSON number; use a finite number or a string")
    return number


WAIT_FALLBACK_POLL_S = 5.0
"""`thread spawn --wait` asks again this often only in case an environment event never reaches it."""
TRANSCRIPT_POLL_S = 0.5
"""How long `thread spawn --wait`'s transcript reader waits for a line before it looks whether to stop."""
TRANSCRIPT_END_S = 2 * TRANSCRIPT_POLL_S


class _SettleWatch:
    """The environment events that say an environment settled, subscribed to before the spawn is
    sent (its environment's id is not known yet): a `ready` that comes before the spawn's answer,
    or while a look is under way, is counted and kept, never cleared unseen."""

    def __init__(self) -> None:
        import asyncio  # loaded by now (the spawn runs on it); only the commands that need it import it

        self.arrived: dict[str, int] = {}  # environment id -> settling events seen
        self.settled_at: dict[str, int] = {}  # environment id -> the latest one's log position
        self.news = asyncio.Event()
        self._subscription: Any = None

    async def start(self, client: ApiClient) -> None:
        self._subscription = await client.nc.subscribe(subjects.environment_event("*", "*"), cb=self._on_event)

    async def stop(self) -> None:
        if self._subscription is not None:
            from nats.errors import Error as NatsError  # imported by now: see connection._client_for

            with contextlib.suppress(NatsError):  # with the connection gone there is nothing to unsubscribe
                await self._subscription.unsubscribe()

    async def _on_event(self, message: Any) -> None:
        environment_id = message.subject.split(".")[2]
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if json.loads(message.data)["status"] in TERMINAL_FOR_WAIT:
                self.arrived[environment_id] = self.arrived.get(environment_id, 0) + 1
                # The stream re-publishes the log's headers, the event's log position among them.
                self.settled_at[environment_id] = max(self.settled_at.get(environment_id, 0),
                                                      subjects.claimed_notification_id(message.headers) or 0)
                self.news.set()


async def _wait_until_settled(client: ApiClient, watch: _SettleWatch, environment_id: str, position: int,
                              timeout: float) -> dict[str, Any]:
    """Stream the transcript to stderr until the environment is ready, failed or gone.

    Returns as soon as an event says so (`watch` has followed the events since before the spawn);
    the look after such an event waits for the read model to reach that event's log position. The
    slow poll is only a safety net.
    """
    import asyncio

    settled = asyncio.Event()

    async def print_transcript() -> None:
        reader = client.read_stream(subjects.TRANSCRIPTS_STREAM, subjects.transcript(environment_id), TRANSCRIPT_POLL_S)
        async with contextlib.aclosing(reader) as batches:
            async for lines in batches:
                for message in lines:
                    with contextlib.suppress(ValueError, KeyError, TypeError):  # not a line of ours: not shown
                        line = json.loads(message.data)
                        stderr.print(("» " if line["kind"] == "step" else "  ") + line["text"], markup=False)
                if settled.is_set():
                    return

    # Each line once: from the transcript's start, then as it grows.
    transcript = asyncio.create_task(print_transcript())
    deadline = time.monotonic() + timeout
    try:
        looked = 0  # the settling events that had arrived before the last look
        current = await client.call("environments", "show", EnvironmentRef(environment_id=environment_id, min_position=position))
        while current["status"] not in TERMINAL_FOR_WAIT:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Failure("failed", f"environment {environment_id} was still {current['status']} after {timeout:.0f} s")
            if watch.arrived.get(environment_id, 0) == looked:  # none since the last look (no await between)
                watch.news.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(watch.news.wait(), min(remaining, WAIT_FALLBACK_POLL_S))
            looked = watch.arrived.get(environment_id, 0)
            current = await _look(client, environment_id, max(position, watch.settled_at.get(environment_id, 0)), position)
        return current
    finally:
        # A cancel landing inside nats-py's fetch does not always end the reader (a spawn --wait
        # hung at its end in 3 runs of 120 side by side): it also stops by itself at its next
        # batch once the wait has settled, and is waited for no longer than that.
        settled.set()
        transcript.cancel()
        ended, _ = await asyncio.wait([transcript], timeout=TRANSCRIPT_END_S)
        if ended and not transcript.cancelled():
            # Taken, not raised: the transcript only accompanies the wait, whose own answer says
            # what happened (a lost connection ends both).
            transcript.exception()


async def _look(client: ApiClient, environment_id: str, claimed: int, known: int) -> dict[str, Any]:
    """`show` once the read model reached the position an event claimed; a message the log never
    wrote (a forgery, were the bus's permissions off) may claim one past the log's end, which the
    service refuses: then the position the service itself gave this spawn is what counts."""
    try:
        return await client.call("environments", "show", EnvironmentRef(environment_id=environment_id,
                                                                          min_position=claimed))
    except ServiceError as refused:
        if refused.code != "invalid_input" or claimed == known:
            raise
        return await client.call("environments", "show", EnvironmentRef(environment_id=environment_id,
                                                                          min_position=known))


@thread_group.command("list")
@click.option("--environment", "environment_id")
@json_option
@click.pass_obj
@run_command
def thread_list(settings: Settings, environment_id: str | None, as_json: bool) -> None:
    """List threads."""
    request = ListThreads(environment_id=environment_id_argument(environment_id) if environment_id else None)

    def human(doc: dict[str, Any]) -> None:
        print_table(("THREAD", "STATUS", "ENVIRONMENT", "PARENT", "REFUSAL"),
                    ([t["id"], t["status"], t["environmentId"] or "-", t["parentThreadId"] or "-",
                      t.get("refusal") or "-"] for t in doc["threads"]),
                    shrink={"REFUSAL": "start"})

    emit(listing(settings, "threads", "list", request, "threads"), as_json, human)


def _thread_command(verb: str, help_text: str, without_environment: str) -> None:
    """`without_environment`: what an answer naming no environment means (no environment changed: the
    thread was archived already, say), in one sentence about thread {thread}, rather than a `-`."""

    @thread_group.command(verb, help=help_text)
    @click.argument("thread_id")
    @json_option
    @click.pass_obj
    @run_command
    def command(settings: Settings, thread_id: str, as_json: bool) -> None:
        request = ThreadRef(thread_id=id_argument("thread id", thread_id))

        def human(doc: dict[str, Any]) -> None:
            if doc.get("environmentId"):
                print_accepted(doc)
            else:
                stdout.print(without_environment.format(thread=request.thread_id), markup=False)

        emit(call(settings, "threads", verb, request, changes=True), as_json, human)


_thread_command("archive", "Archive a thread; its environment retires after its last thread leaves.",
                "thread {thread} is archived; no environment changed")
_thread_command("unarchive", "Unarchive a thread; inside the retire grace its environment is kept.",
                "thread {thread} is active; no environment changed")
_thread_command("cancel", "Cancel the thread's message; a preparing environment only it waits for is cancelled.",
                "thread {thread} had no preparing environment of its own to cancel; nothing changed")
