"""`bb environment`: list, show (now or as it was), retry and delete environments, list their
providers, and an environment's history."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import (
    EnvironmentAt,
    EnvironmentRef,
    HookOutputAt,
    ListEnvironments,
    ListHistory,
    Nothing,
)
from bb_environments.domain.disk import human_bytes
from bb_environments.domain.ids import is_environment_id_prefix, quoted
from bb_environments.domain.request_errors import one_line
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.entrypoints.cli.connection import call, listing, open_client
from bb_environments.entrypoints.cli.support import (
    Failure,
    clock,
    duration,
    emit,
    environment_id_argument,
    fitted,
    json_lines_option,
    json_option,
    port_range,
    print_accepted,
    print_table,
    run_command,
    stdout,
    wait_json_option,
)
from bb_environments.entrypoints.cli.waiting import REMOVED, SETTLED, Ends, change_and_wait, emit_ended, wait_options
from bb_environments.entrypoints.config import Settings

TRANSCRIPT_POLL_S = 0.5
"""How long `logs`'s transcript reader waits for a line before it looks whether to stop."""

if TYPE_CHECKING:  # opened by open_client, which imports it once the URL is known
    from bb_environments.bus.api_client.nats_client import ApiClient


@click.group("environment")
def environment_group() -> None:
    """Inspect and manage environments."""


@environment_group.command("providers")
@json_option
@click.pass_obj
@run_command
def environment_providers(settings: Settings, as_json: bool) -> None:
    """List the environment providers with their inputs and availability."""
    document = call(settings, "environments", "providers", Nothing())

    def human(doc: dict[str, Any]) -> None:
        def row(p: dict[str, Any]) -> list[str]:
            availability = p["availability"]["status"] + (
                f" ({p['availability']['reason']})" if p["availability"].get("reason") else ""
            )
            grace = p["policy"]["retireGraceMs"]
            return [p["id"], p["displayName"], availability, "never" if grace is None else f"{grace} ms"]

        print_table(
            ("ID", "NAME", "AVAILABILITY", "RETIRE GRACE"), map(row, doc["providers"]), shrink={"AVAILABILITY": "start"}
        )

    emit(document, as_json, human)


@environment_group.command("list")
@click.option(
    "--status",
    type=click.Choice([s.value for s in EnvironmentStatus]),
    help="Only environments in this status (removed ones included when asked for).",
)
@click.option("--provider", help="Only environments of this provider id.")
@click.option("--all", "include_removed", is_flag=True, help="Also list removed environments.")
@json_option
@click.pass_obj
@run_command
def environment_list(
    settings: Settings, status: str | None, provider: str | None, include_removed: bool, as_json: bool
) -> None:
    """List environments that are not removed (with --all, removed ones too)."""
    request = ListEnvironments(
        status=EnvironmentStatus(status) if status else None, provider=provider, include_removed=include_removed
    )
    document = listing(settings, "environments", "list", request, "environments")

    emit(document, as_json, _print_listing)


def _print_listing(doc: dict[str, Any]) -> None:
    # A whole id, a status and a size leave no room in 80 columns for the provider, the path or
    # the ports: `show` and `--json` have them (and `--provider` picks by provider).
    print_table(
        ("ID", "STATUS", "SLUG", "THREADS", "DISK"),
        (
            [
                e["id"],
                e["status"],
                e.get("slug") or "-",
                _threads_cell(e["threadIds"]),
                _disk_cell(e.get("diskBytes")),  # absent from a service before disk scans
            ]
            for e in doc["environments"]
        ),
        shrink={"SLUG": "end", "THREADS": "start"},  # a slug's end is its own; a thread's start
    )


def _disk_cell(disk_bytes: int | None) -> str:
    """As `du -h` writes a size (1.2G); `-` until the workspace is measured."""
    return "-" if disk_bytes is None else human_bytes(disk_bytes)


def _threads_cell(thread_ids: list[str]) -> str:
    """The first thread whole (an id is copied from here) and how many more: an environment many
    threads share must not widen every row; `show` lists them all."""
    if not thread_ids:
        return "-"
    return thread_ids[0] + (f" +{len(thread_ids) - 1}" if len(thread_ids) > 1 else "")


@environment_group.command("show")
@click.argument("environment_id")
@click.option(
    "--at",
    "at",
    metavar="VERSION|ISO-8601",
    help="As it was at this version, or at this instant (the last version recorded then or before).",
)
@json_option
@click.pass_obj
@run_command
def environment_show(settings: Settings, environment_id: str, at: str | None, as_json: bool) -> None:
    """Show one environment, with the tail of its transcript (with --at: as it was then)."""
    request = EnvironmentAt(
        environment_id=environment_id_argument(environment_id), at=None if at is None else _version_or_instant(at)
    )
    emit(call(settings, "environments", "show", request), as_json, _print_environment)


def _version_or_instant(value: str) -> int | datetime:
    if value.isdigit() and int(value) >= 1:
        return int(value)
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        instant = None
    if instant is None or instant.tzinfo is None:
        raise Failure(
            "invalid_input",
            f"--at {quoted(value)} is neither a version (1 or more) nor an ISO-8601 "
            "instant with a timezone (2026-01-31T12:00:00Z, say)",
        )
    return instant


@environment_group.command("history")
@click.argument("environment_id")
@json_option
@click.pass_obj
@run_command
def environment_history(settings: Settings, environment_id: str, as_json: bool) -> None:
    """List an environment's events in order, with the time from each to the next."""
    request = ListHistory(environment_id=environment_id_argument(environment_id))
    listed = listing(settings, "environments", "history", request, "events")
    whole_id = request.environment_id
    if is_environment_id_prefix(whole_id):  # the document names the whole id, which the service resolves
        whole_id = call(settings, "environments", "show", EnvironmentRef(environment_id=whole_id))["id"]
    document = {"environmentId": whole_id, **listed}

    def human(doc: dict[str, Any]) -> None:
        print_table(
            ("VERSION", "EVENT", "TIME", "DURATION"),
            ([str(e["version"]), e["type"], clock(e["occurredAt"]), duration(e["durationMs"])] for e in doc["events"]),
        )

    emit(document, as_json, human)


@environment_group.command("logs")
@click.argument("environment_id")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Then print each line as it is written, until interrupted (as `docker logs -f`).",
)
@click.option(
    "--hook-output",
    is_flag=True,
    help="Instead, print the whole output of its setup and teardown as their host keeps it (the "
    "transcript keeps the last 2000 lines of an environment).",
)
@json_lines_option
@click.pass_obj
@run_command
async def environment_logs(
    settings: Settings, environment_id: str, follow: bool, hook_output: bool, as_json: bool
) -> None:
    """Print the environment's transcript from its start (the last 2000 lines the stream keeps)."""
    request = EnvironmentRef(environment_id=environment_id_argument(environment_id))
    if hook_output and follow:
        raise Failure("invalid_input", "--hook-output prints what the host keeps now: leave out --follow")
    client = await open_client(settings)
    try:
        shown = await client.call("environments", "show", request)  # unknown: exit 3; a start resolved
        whole_id = shown["id"]
        if hook_output:
            await _print_hook_output(client, shown, as_json)
            return
        reader = client.read_stream(subjects.TRANSCRIPTS_STREAM, subjects.transcript(whole_id), TRANSCRIPT_POLL_S)
        async with contextlib.aclosing(reader) as batches:
            async for lines in batches:
                if not lines and not follow:
                    return  # an empty batch: nothing is stored beyond what was printed
                for message in lines:
                    sys.stdout.write((message.data.decode() if as_json else _transcript_line(message.data)) + "\n")
                sys.stdout.flush()
                if lines and not follow and lines[-1].metadata.num_pending == 0:
                    return
    finally:
        await client.close()


async def _print_hook_output(client: ApiClient, environment: dict[str, Any], as_json: bool) -> None:
    """Each hook's whole output, page by page, from its host's records: setup first, then teardown."""
    for kind in ("setup", "teardown"):
        operation_id = (environment.get("hooks", {}).get(kind) or {}).get("operationId")
        if not operation_id:
            continue
        if not as_json:
            sys.stdout.write(f"» {kind} ({operation_id}), as host {environment['hostId']} keeps it\n")
        offset, more = 0, True
        while more:
            page = await client.call(
                "environments",
                "output",
                HookOutputAt(environment_id=environment["id"], operation_id=operation_id, offset=offset),
            )
            if as_json:
                sys.stdout.write(json.dumps({"operationId": operation_id, "kind": kind, "text": page["text"]}) + "\n")
            else:
                sys.stdout.write(page["text"])
            offset, more = page["nextOffset"], page["more"]
        sys.stdout.flush()


def _transcript_line(data: bytes) -> str:
    """A line as a person reads it: when, a `»` for a step of the work (its output indented), the text."""
    try:
        line = json.loads(data)
        return fitted(f"{clock(line['occurredAt'])}  {'»' if line['kind'] == 'step' else ' '} ", line["text"])
    except (ValueError, KeyError, TypeError, AttributeError):  # not a line of ours: shown as it came
        return one_line(data.decode(errors="replace"))


def _environment_command(verb: str, help_text: str, ends: Ends, wait_help: str) -> None:
    """A command on one environment, with --wait: follow it until it reaches one of `ends`."""

    @environment_group.command(verb, help=help_text)
    @click.argument("environment_id")
    @wait_options(wait_help)
    @wait_json_option
    @click.pass_obj
    @run_command
    def command(
        settings: Settings, environment_id: str, wait: bool, timeout: float, as_json: bool
    ) -> Coroutine[Any, Any, None] | None:
        request = EnvironmentRef(environment_id=environment_id_argument(environment_id))
        if wait:

            async def waited() -> None:
                emit_ended(
                    await change_and_wait(settings, "environments", verb, request, ends, timeout),
                    ends,
                    as_json,
                    print_accepted,
                )

            return waited()
        emit(call(settings, "environments", verb, request, changes=True), as_json, _said_of(verb))
        return None


def _said_of(verb: str) -> Callable[[dict[str, Any]], None]:
    """What the answer to `verb` says: a deletion that finds the environment removed already (an
    answer's status never is that of a removal it started) says so in a sentence."""

    def said(doc: dict[str, Any]) -> None:
        if verb == "delete" and doc.get("status") == EnvironmentStatus.REMOVED:
            stdout.print(f"environment {doc['environmentId']} was removed already; nothing changed", markup=False)
        else:
            print_accepted(doc)

    return said


def _print_environment(e: dict[str, Any]) -> None:
    # Every text here may come from a provider, a hook's output or a path: printed as plain text
    # (a git message's '[rejected]' is no markup), with what would drive the terminal escaped.
    from rich.markup import escape

    message = f" — {one_line(e['statusMessage'])}" if e.get("statusMessage") else ""
    stdout.print(f"[bold]{e['id']}[/bold]  {e['status']}{escape(message)}")
    for label, value in (
        ("provider", e["providerId"]),
        ("host", e["hostId"]),
        ("project", e["projectPath"]),
        ("path", e["path"]),
        ("owns path", e["ownsPath"]),
        ("slug", e.get("slug")),
        ("ports", port_range(e.get("ports"))),
        ("disk", None if e.get("diskBytes") is None else f"{human_bytes(e['diskBytes'])} ({e['diskBytes']} bytes)"),
        ("threads", ", ".join(e["threadIds"])),
        ("setup", e["hooks"]["setup"]["status"]),
        ("teardown", e["hooks"]["teardown"]["status"]),
    ):
        stdout.print(f"  {label:<10} {one_line(_readable(value))}", markup=False)
    if e.get("savedRef"):
        stdout.print(f"  saved work: {e['savedRef']}  (git worktree add <dir> {e['savedRef']})", markup=False)
    for line in e.get("transcript", []):
        stdout.print(fitted("  │ ", line), markup=False)


def _readable(value: Any) -> str:
    """A field as a person reads it: nothing (a null, an empty list) as `-`, a flag as yes or no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None or value == "" else str(value)


_environment_command(
    "delete",
    "Retire now: cancel an in-flight create, tear down, remove.",
    REMOVED,
    "Stream progress to stderr until the environment is removed or failed.",
)
_environment_command(
    "retry",
    "Retry a failed create, or re-run a failed setup in the same workspace.",
    SETTLED,
    "Stream progress to stderr until the environment is ready or failed.",
)
