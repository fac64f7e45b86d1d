"""`bb thread`: spawn a thread (and with --wait, follow its environment's events and transcript until
it settles), list, archive, unarchive and cancel threads."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Coroutine
from typing import Any

import click

from bb_environments.bus.wire.api_messages import ListThreads, SpawnThread, ThreadRef
from bb_environments.bus.wire.service_errors import AnswerLost, ServiceError
from bb_environments.entrypoints.cli.connection import call, listing, open_client, sendable
from bb_environments.entrypoints.cli.support import (
    Failure,
    emit,
    environment_id_argument,
    host_id_argument,
    id_argument,
    json_option,
    print_accepted,
    print_table,
    run_command,
    stdout,
    wait_json_option,
)
from bb_environments.entrypoints.cli.waiting import (
    LEFT,
    SETTLED,
    SettleWatch,
    change_and_wait,
    emit_ended,
    lost,
    wait_options,
    wait_until_settled,
)
from bb_environments.entrypoints.config import Settings


@click.group("thread")
def thread_group() -> None:
    """Spawn and manage threads."""


@thread_group.command("spawn")
@click.option(
    "--environment-provider",
    "provider",
    help="A new environment of this provider (`bb environment providers` lists them).",
)
@click.option(
    "--environment-inputs",
    "inputs_text",
    help="The provider's inputs as JSON (docs/providers.md); needs --environment-provider.",
)
@click.option("--environment", "environment_id", help="Join this existing environment (an id, or its start).")
@click.option("--project", help="The project the thread works on: an absolute path on its host.")
@click.option("--thread-id", help="The thread's id (default: a new one); 1-128 letters, digits, '-' or '_'.")
@click.option("--parent", help="The parent thread: a child shares its environment where the provider says so.")
@click.option("--host", help="The host its environment runs on (default: the service's).")
@click.option(
    "--prompt", help="The thread's first message, published on bb.threads.<T>.message for the agent that runs it."
)
@wait_options("Stream progress to stderr until the environment is ready or failed.")
@wait_json_option
@click.pass_obj
@run_command
async def thread_spawn(
    settings: Settings,
    provider: str | None,
    inputs_text: str | None,
    environment_id: str | None,
    project: str | None,
    thread_id: str | None,
    parent: str | None,
    host: str | None,
    prompt: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Create a thread and give it an environment."""
    if inputs_text is not None and provider is None:
        raise Failure("invalid_input", "--environment-inputs needs --environment-provider")
    inputs = parse_inputs(inputs_text)
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
        thread_id=thread_id,
        environment_provider=provider,
        environment_inputs=inputs,
        environment_id=environment_id_argument(environment_id) if environment_id is not None else None,
        project_path=os.path.abspath(project) if project else None,
        host_id=host,
        parent_thread_id=parent,
        prompt=prompt,
    )
    sendable(request)
    client = await open_client(settings)
    from nats.errors import Error as NatsError  # nats-py is imported once the URL is known: see connection._client_for

    watch = SettleWatch()
    try:
        if wait:
            await watch.start(client)
        try:
            spawned = await client.call("threads", "spawn", request)
        except AnswerLost as answer_lost:
            raise lost(
                f"{answer_lost.message}; thread {thread_id} may have been spawned all the same: `bb thread list` "
                f"shows it once the service is back, and the same spawn with --thread-id {thread_id} is "
                "answered for it rather than spawned twice",
                threadId=thread_id,
            ) from None
        document = {
            "threadId": spawned["threadId"],
            "environmentId": spawned["environmentId"],
            "status": spawned["status"],
        }
        if wait and spawned["environmentId"]:
            try:
                final = await wait_until_settled(client, watch, spawned["environmentId"], spawned["position"], timeout)
            except (ServiceError, NatsError) as gone:
                if isinstance(gone, ServiceError) and gone.code != "unreachable":
                    raise
                raise lost(
                    f"lost the bb service while waiting for environment {spawned['environmentId']} of "
                    f"thread {thread_id}; the environment goes on without this command: "
                    f"`bb environment show {spawned['environmentId']}` follows it once the service is back",
                    threadId=thread_id,
                    environmentId=spawned["environmentId"],
                ) from None
            document["status"] = final["status"]
            document["statusMessage"] = final.get("statusMessage")
    finally:
        await watch.stop()
        await client.close()

    def human(d: dict[str, Any]) -> None:
        stdout.print(f"{d['threadId']}  {d['environmentId']}  {d['status']}", markup=False)

    if wait:
        emit_ended(document, SETTLED, as_json, human)
    else:
        emit(document, as_json, human)


def parse_inputs(text: str | None, option: str = "--environment-inputs") -> Any:
    """A provider's inputs given as JSON to `option`; None when not given."""

    def refuse_constant(name: str) -> float:
        # Python's json reads NaN and Infinity, which JSON has not: the bus would carry them as null.
        raise Failure(
            "invalid_input", f"{option} contains {name}, which is not a JSON number; use a finite number or a string"
        )

    def finite_number(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):
            raise Failure(
                "invalid_input",
                f"{option} contains the number {text}, which is too large "
                "for a JSON number; use a finite number or a string",
            )
        return number

    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=refuse_constant, parse_float=finite_number)
    except json.JSONDecodeError as bad:
        raise Failure("invalid_input", f"{option} is not valid JSON: {bad}") from None
    except RecursionError:
        # The service refuses inputs nested deeper than a few dozen levels; these cannot even be read.
        raise Failure(
            "invalid_input",
            f"{option} nests objects and arrays too deeply to be read; provider inputs need a few levels at most",
        ) from None


@thread_group.command("list")
@click.option("--environment", "environment_id", help="Only the threads of this environment (an id, or its start).")
@json_option
@click.pass_obj
@run_command
def thread_list(settings: Settings, environment_id: str | None, as_json: bool) -> None:
    """List threads."""
    request = ListThreads(environment_id=environment_id_argument(environment_id) if environment_id else None)

    def human(doc: dict[str, Any]) -> None:
        print_table(
            ("THREAD", "STATUS", "ENVIRONMENT", "PARENT", "REFUSAL"),
            (
                [t["id"], t["status"], t["environmentId"] or "-", t["parentThreadId"] or "-", t.get("refusal") or "-"]
                for t in doc["threads"]
            ),
            shrink={"REFUSAL": "start"},
        )

    emit(listing(settings, "threads", "list", request, "threads"), as_json, human)


def _thread_command(verb: str, help_text: str, without_environment: str, wait_help: str | None = None) -> None:
    """`without_environment`: what an answer naming no environment means (no environment changed: the
    thread was archived already, say), in one sentence about thread {thread}, rather than a `-`.
    `wait_help`: the command takes --wait, which follows the environment until it is removed or
    kept ready."""

    def command(
        settings: Settings, thread_id: str, as_json: bool, wait: bool = False, timeout: float = 0
    ) -> Coroutine[Any, Any, None] | None:
        request = ThreadRef(thread_id=id_argument("thread id", thread_id))

        def human(doc: dict[str, Any]) -> None:
            if doc.get("environmentId"):
                print_accepted(doc)
            else:
                stdout.print(without_environment.format(thread=request.thread_id), markup=False)

        if wait:

            async def waited() -> None:
                emit_ended(
                    await change_and_wait(settings, "threads", verb, request, LEFT, timeout), LEFT, as_json, human
                )

            return waited()
        emit(call(settings, "threads", verb, request, changes=True), as_json, human)
        return None

    decorated: Callable[..., Any] = (wait_json_option if wait_help else json_option)(
        click.pass_obj(run_command(command))
    )
    if wait_help:
        decorated = wait_options(wait_help)(decorated)
    thread_group.command(verb, help=help_text)(click.argument("thread_id")(decorated))


_thread_command(
    "archive",
    "Archive a thread; its environment retires after its last thread leaves.",
    "thread {thread} is archived; no environment changed",
    wait_help="Stream progress to stderr until the thread's environment is removed, or kept ready.",
)
_thread_command(
    "unarchive",
    "Unarchive a thread; inside the retire grace its environment is kept.",
    "thread {thread} is active; no environment changed",
)
_thread_command(
    "cancel",
    "Cancel the thread's message; a preparing environment only it waits for is cancelled.",
    "thread {thread} had no preparing environment of its own to cancel; nothing changed",
)
