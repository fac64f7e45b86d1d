"""`bb events`: follow the live events (tail), print the whole log (export), rebuild the read models
from it (replay). Tail and export read the streams themselves, with nats-py; export reads what the
log stream no longer holds (retention purged it) from the event store."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import click
import msgspec

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import Nothing
from bb_environments.domain.ids import quoted
from bb_environments.domain.request_errors import one_line
from bb_environments.entrypoints.cli.connection import call, open_client
from bb_environments.entrypoints.cli.support import (
    Failure,
    clock,
    emit,
    fitted,
    json_lines_option,
    json_option,
    run_command,
    stdout,
)
from bb_environments.entrypoints.config import ConfigError, Settings, serving

if TYPE_CHECKING:  # loads eventsourcing, which only an export that needs the store imports
    from bb_environments.entrypoints.event_store import StoredLog


TRANSCRIPT_SUBJECTS = subjects.TRANSCRIPT_EVENTS.removesuffix(">")


@click.group("events")
def events_group() -> None:
    """Watch, export and replay the event log."""


@events_group.command("tail")
@click.argument("subject_filter", default=subjects.ENVIRONMENT_EVENTS)
@json_lines_option
@click.pass_obj
@run_command
async def events_tail(settings: Settings, subject_filter: str, as_json: bool) -> None:
    """Print live events until interrupted."""
    _check_tail_filter(subject_filter)
    import asyncio  # only the commands that subscribe load it

    client = await open_client(settings)
    reader_left = asyncio.Event()
    statuses: dict[str, str] = {}  # environment id -> the status its last event printed here reached

    async def show(message: Any) -> None:
        if as_json:
            line = message.data.decode()
        else:
            try:
                line = _tail_line(message.subject, json.loads(message.data), statuses)
            except (ValueError, AttributeError, TypeError):  # not an event of ours: shown as it came
                line = one_line(f"{message.subject}  {message.data.decode(errors='replace')}")
        try:
            print(line, flush=True)
        except BrokenPipeError:  # raised here, inside nats-py's callback, it would end nothing
            reader_left.set()

    await client.nc.subscribe(subject_filter, cb=show)
    try:
        ended = [asyncio.ensure_future(client.until_closed()), asyncio.ensure_future(reader_left.wait())]
        await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
        for waiting in ended:
            waiting.cancel()
    finally:
        await client.close()
    if reader_left.is_set():
        raise BrokenPipeError("the reader of stdout left")  # `| head`: run_cli ends quietly
    raise Failure(
        "unreachable",
        "the connection to the bb service dropped and did not come back; tail again once the service is back",
    )


def _tail_line(subject: str, event: dict[str, Any], statuses: dict[str, str]) -> str:
    """When, which environment, and what: a transcript line's text (a step marked `»`), or an
    event's type and, when it changed, the status it reached (`created → provisioning`), in 80
    columns: the environment's id whole, what is said wrapped under it."""
    transcript = subject.startswith(TRANSCRIPT_SUBJECTS)
    environment_id = subject.split(".")[2]
    if transcript:
        said = ("» " if event.get("kind") == "step" else "") + str(event.get("text", ""))
    else:
        status = str(event.get("status", ""))
        event_type = subject.split(".")[-1]
        changed = statuses.get(environment_id) != status and event_type != status  # `ready`: nothing to add
        said = event_type + (f" → {status}" if changed else "")
        statuses[environment_id] = status
    when = clock(str(event.get("occurredAt", "")))
    return fitted(f"{when}  {environment_id}  ", said, indent=len(when) + 2)


def _check_tail_filter(subject_filter: str) -> None:
    """A filter the server would refuse (a malformed subject) or that reaches beyond what a client
    may read is a mistake to say at once, not a subscription that stays silent forever."""
    tokens = subject_filter.split(".")
    well_formed = all(token and not any(c.isspace() for c in token) for token in tokens) and ">" not in tokens[:-1]
    readable = [prefix.removesuffix(".>") for prefix in (subjects.ENVIRONMENT_EVENTS, subjects.TRANSCRIPT_EVENTS)]
    # Nothing is published on `bb.environments` itself: a filter needs a token beyond the prefix.
    if not well_formed or len(tokens) < 3 or ".".join(tokens[:2]) not in readable:
        raise Failure(
            "invalid_input",
            f"subject filter {quoted(subject_filter)} is not one events tail can follow: give "
            f"a NATS subject under {' or '.join(p + '.>' for p in readable)}, "
            "e.g. 'bb.environments.*.ready'",
        )


@events_group.command("export")
@json_lines_option
@click.pass_obj
@run_command
async def events_export(settings: Settings, as_json: bool) -> None:
    """Print the whole log as JSON lines, in log order (from the event store itself while no `bb
    serve` runs on this data dir)."""
    if serving(settings.data_dir) is None:
        _export_from_store(settings)
        return
    client = await open_client(settings)
    # Opened at the first notification the stream no longer holds (retention purged it).
    store: StoredLog | None = None
    try:
        js = client.nc.jetstream()
        info = await js.stream_info(subjects.ENVIRONMENTS_STREAM)
        if info.state.messages == 0:
            return
        delivered, at = 0, 0  # messages the reader was given, and the stream sequence of the last
        following = 1  # the notification id the next document should carry
        async with contextlib.aclosing(
            client.read_stream(subjects.ENVIRONMENTS_STREAM, subjects.LOG_EVENTS, 10.0)
        ) as log:
            async for messages in log:
                if not messages:
                    raise Failure(
                        "unreachable",
                        f"the log stopped arriving after stream sequence {at} of "
                        f"{info.state.last_seq}; run the export again",
                    )
                for message in messages:
                    delivered, at = delivered + 1, message.metadata.sequence.stream
                    if message.metadata.sequence.consumer != delivered:  # lost on the way: a reconnect, say
                        raise Failure(
                            "unreachable",
                            f"a message of the log was lost on the way before stream "
                            f"sequence {at}; run the export again",
                        )
                    claimed = subjects.claimed_notification_id(message.headers)
                    if claimed is not None and claimed > following:
                        store = store or _store_of(settings)
                        sys.stdout.writelines(
                            payload.decode() + "\n" for payload in store.payloads(following - 1, claimed - 1)
                        )
                    following = max(following, (claimed or 0) + 1)
                    sys.stdout.write(message.data.decode() + "\n")
                # The last sequence may be a message the relay deleted (one the store did not write).
                if at >= info.state.last_seq or messages[-1].metadata.num_pending == 0:
                    break
    finally:
        if store is not None:
            store.close()
        await client.close()


def _store_of(settings: Settings) -> StoredLog:
    from bb_environments.entrypoints.event_store import StoredLog

    try:
        return StoredLog(settings.event_store)
    except ConfigError as missing:
        raise Failure("not_found", str(missing)) from None


def _export_from_store(settings: Settings) -> None:
    store = _store_of(settings)
    try:
        for payload in store.payloads():
            sys.stdout.write(payload.decode() + "\n")
    finally:
        store.close()


@events_group.command("replay")
@json_option
@click.pass_obj
@run_command
def events_replay(settings: Settings, as_json: bool) -> Coroutine[Any, Any, None] | None:
    """Rebuild every read model from the event log; print the counts (from the event store itself
    while no `bb serve` runs on this data dir)."""

    def show(counts: dict[str, Any]) -> None:
        emit(
            counts,
            as_json,
            lambda c: stdout.print(
                f"replayed {c['events']} events: {c['environments']} environments, {c['threads']} threads", markup=False
            ),
        )

    if serving(settings.data_dir) is None:

        async def from_store() -> None:
            from bb_environments.entrypoints.event_store import replay_stored

            try:
                counts = await replay_stored(settings)
            except ConfigError as missing:
                raise Failure("not_found", str(missing)) from None
            # None: a `bb serve` took the data dir meanwhile, and replays for itself.
            show(msgspec.to_builtins(counts) if counts else call(settings, "events", "replay", Nothing(), changes=True))

        return from_store()
    show(call(settings, "events", "replay", Nothing(), changes=True))
    return None
