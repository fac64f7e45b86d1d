"""The `bb` command line (SPEC §3). Every command takes --json; exit codes follow the SPEC:
0 success, 1 the operation failed, 2 invalid input, 3 not found, 4 service unreachable."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click
import msgspec

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import MAX_PAGE, EnvironmentRef, ListEnvironments, ListThreads, Nothing, Request, SpawnThread, ThreadRef
from bb_environments.bus.api_client.service_errors import AnswerLost, ServiceError, unreachable
from bb_environments.domain.status import EnvironmentStatus
from bb_environments.domain.ids import HOST_ID_PATTERN, HOST_ID_RULE, ID_PATTERN, ID_RULE, quoted
from bb_environments.entrypoints.cli_support import (
    Failure, LazyGroup, Seconds, emit, event_loop, fail, json_option, print_table, run_cli, run_command, stderr, stdout,
)
from bb_environments.entrypoints.config import ConfigError, ServerFileError, ServerInfo, Settings, nats_credentials, read_server_file, serving
from bb_environments.handlers.errors import one_line

if TYPE_CHECKING:  # imported by open_client, once the URL is known
    from bb_environments.bus.api_client.nats_client import ApiClient

R = TypeVar("R", bound=Request)

WAIT_AT_MOST_S = 7 * 24 * 3600.0
"""The longest `thread spawn --timeout`: beyond a week a wait is a mistake, not a plan."""
TERMINAL_FOR_WAIT = {
    EnvironmentStatus.READY: 0, EnvironmentStatus.ERROR: 1, EnvironmentStatus.REMOVING: 1, EnvironmentStatus.REMOVED: 1,
    EnvironmentStatus.RETIRING: 1,
}
"""The statuses `thread spawn --wait` stops at, with its exit code for each."""


def embedded_server(settings: Settings) -> ServerInfo | None:
    """The running service's server.json, unless the settings name an external NATS."""
    if settings.nats_url is not None:
        return None
    try:
        return read_server_file(settings.server_file)
    except ServerFileError as unusable:
        running = serving(settings.data_dir)
        hint = f"`bb serve` (pid {running.pid}) writes it again within seconds" if running else None
        raise unreachable(str(unusable), settings.data_root, hint) from None


async def open_client(settings: Settings, server: ServerInfo | None = None) -> ApiClient:
    """As the operator: with the seed server.json names for the embedded server (`server`, when
    the caller has read it already), else with the deployment's credentials from the environment
    (an external NATS)."""
    if server is None:
        server = embedded_server(settings)
    if server is None:
        assert settings.nats_url is not None
        return await _client_for(settings.nats_url).connect(settings.nats_url, settings.data_root,
                                                            **nats_credentials(settings.nats_url))
    if server.credentials is None:
        return await _client_for(server.nats_url).connect(server.nats_url, settings.data_root,
                                                          **nats_credentials(server.nats_url))
    # The embedded server's service runs on this machine: a request it can no longer answer (its
    # process ended) fails at once, not after the timeout.
    return await _client_for(server.nats_url).connect(server.nats_url, settings.data_root, service_pid=server.pid,
                                                      nkeys_seed=server.credentials.operator)


def _client_for(url: str) -> type[ApiClient]:
    """The API client, imported only now that the URL is known. nats-py imports aiohttp (about a
    quarter of a second) when it is imported, only to speak WebSocket, and goes without it when
    aiohttp cannot be imported: for a URL that is not ws:// or wss:// (tested as nats-py tests it)
    this process keeps aiohttp out. Nothing else a command that connects runs needs aiohttp; the
    Modal SDK does, but `bb machine` and `bb modal` never connect to the bus."""
    if "nats" not in sys.modules and "ws://" not in url and "wss://" not in url:
        sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]  # None: "cannot be imported"
    from bb_environments.bus.api_client.nats_client import ApiClient

    return ApiClient


class Requester(Protocol):
    def call(self, area: str, verb: str, body: Request) -> dict[str, Any]: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def requests_to(settings: Settings) -> Iterator[Requester]:
    """A connection for a command that only sends requests and prints their answers. To the
    embedded server over a plain socket (bus/api_client/blocking_client.py: such a command then loads
    neither asyncio nor nats-py, most of its run time); to an external NATS with nats-py."""
    server = embedded_server(settings)
    client: Requester
    if server is not None and server.credentials is not None and server.nats_url.startswith("nats://"):
        from bb_environments.bus.api_client.blocking_client import BlockingApiClient

        client = BlockingApiClient.connect(server.nats_url, server.credentials.operator, settings.data_root,
                                           server.pid)
    else:
        client = _OnLoop(settings, server)
    try:
        yield client
    finally:
        client.close()


class _OnLoop:
    """nats-py's ApiClient behind the blocking calls of `requests_to`, on an event loop of its own
    that runs while a call waits."""

    def __init__(self, settings: Settings, server: ServerInfo | None) -> None:
        self._runner = event_loop()
        try:
            self._client = self._runner.run(open_client(settings, server))
        except BaseException:
            self._runner.close()
            raise

    def call(self, area: str, verb: str, body: Request) -> dict[str, Any]:
        return self._runner.run(self._client.call(area, verb, body))

    def close(self) -> None:
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.close()


def call(settings: Settings, area: str, verb: str, body: Request, changes: bool = False) -> dict[str, Any]:
    """`changes`: the request changes something, which may have happened if its answer was lost."""
    sendable(body)
    with requests_to(settings) as client:
        try:
            return client.call(area, verb, body)
        except AnswerLost as lost:
            if not changes:
                raise
            raise AnswerLost(f"{lost.message}; it may have taken effect all the same") from None


def listing(settings: Settings, area: str, verb: str, request: ListEnvironments | ListThreads,
            key: str) -> dict[str, Any]:
    """Every page of a listing, as one document `{key: [...]}` (the API pages; see README). Pages
    as large as may be asked: the service still cuts each to what one message can carry."""
    request = msgspec.structs.replace(sendable(request), limit=MAX_PAGE)
    found: list[Any] = []
    # The items are acyclic dicts: the cyclic collector would only rescan the ever longer list of
    # them, which took a fifth of the CLI's time for 100,000 environments.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with requests_to(settings) as client:
            while True:
                page = client.call(area, verb, request)
                found.extend(page[key])
                if page.get("next") is None:
                    return {key: found}
                request = msgspec.structs.replace(request, after=page["next"])
    finally:
        if collecting:
            gc.enable()


def environment_id_argument(value: str) -> str:
    from uuid import UUID  # here: only commands that take an id pay for the module

    try:
        return str(UUID(value))
    except ValueError:
        raise Failure("invalid_input", f"environment id {quoted(value)} is not a valid id (expected a UUID)") from None


def id_argument(what: str, value: str) -> str:
    """A thread id, checked as the service checks it: a malformed one is the caller's to fix (exit
    2) whether the service is up or not, as a malformed environment id is."""
    if not re.match(ID_PATTERN, value):
        raise Failure("invalid_input", f"{what} {quoted(value)} is not allowed: use {ID_RULE}")
    return value


def host_id_argument(value: str) -> str:
    """A host id, checked as `id_argument` checks a thread id."""
    if not re.match(HOST_ID_PATTERN, value):
        raise Failure("invalid_input", f"host id {quoted(value)} is not allowed: use {HOST_ID_RULE}")
    return value


def sendable(request: R) -> R:
    """The request, if JSON can carry it: an argument that is not UTF-8 (bytes of a file name, say)
    is refused naming it, rather than failing the encoding on the way out."""
    for name in request.__struct_fields__:
        try:
            msgspec.json.encode(getattr(request, name))
        except UnicodeEncodeError:
            raise Failure("invalid_input", f"the {name.replace('_', ' ')} is not UTF-8 text; pass it as UTF-8") from None
    return request


@click.group()
@click.option("--data-dir", help="Service data directory (default $BB_DATA_DIR or ~/.local/share/bb).")
@click.option("--nats-url", help="Use this NATS instead of the embedded one (default $BB_NATS_URL).")
@click.pass_context
def cli(context: click.Context, data_dir: str | None, nats_url: str | None) -> None:
    """bb environments: isolated workspaces for agent threads."""
    try:
        context.obj = Settings.load(data_dir, nats_url)
    except ConfigError as bad:
        fail("invalid_input", str(bad), False)


@cli.command()
@click.option("--data-dir", help="Same as `bb --data-dir`, accepted here too.")
@click.option("--nats-url", help="Same as `bb --nats-url`, accepted here too.")
@json_option
@click.pass_obj
def serve(settings: Settings, data_dir: str | None, nats_url: str | None, as_json: bool) -> None:
    """Run the service: embedded nats-server, event store, read models, host agent."""
    import logging

    from bb_environments.entrypoints.serve import ServeError, serve as run_service

    if data_dir or nats_url:
        settings = Settings.load(data_dir or settings.data_root, nats_url or settings.nats_url)

    logging.basicConfig(level=os.environ.get("BB_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def announce(info: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(info), flush=True)
        stderr.print(f"bb serving on {info['natsUrl']} (data dir {info['dataDir']})", markup=False)

    try:
        with event_loop() as loop:
            loop.run(run_service(settings, announce))
    except ServeError as failed:
        fail("failed", str(failed), as_json)


# -- environments ----------------------------------------------------------------------------------


@cli.group()
def environment() -> None:
    """Inspect and manage environments."""


@environment.command("providers")
@json_option
@click.pass_obj
@run_command
def environment_providers(settings: Settings, as_json: bool) -> None:
    """List the environment providers with their inputs and availability."""
    document = call(settings, "environments", "providers", Nothing())

    def human(doc: dict[str, Any]) -> None:
        def row(p: dict[str, Any]) -> list[str]:
            availability = p["availability"]["status"] + (f" ({p['availability']['reason']})" if p["availability"].get("reason") else "")
            grace = p["policy"]["retireGraceMs"]
            return [p["id"], p["displayName"], availability, "never" if grace is None else f"{grace} ms"]

        print_table(("ID", "NAME", "AVAILABILITY", "RETIRE GRACE"), map(row, doc["providers"]))

    emit(document, as_json, human)


@environment.command("list")
@click.option("--status", type=click.Choice([s.value for s in EnvironmentStatus]))
@click.option("--provider")
@click.option("--all", "include_removed", is_flag=True, help="Also list removed environments.")
@json_option
@click.pass_obj
@run_command
def environment_list(settings: Settings, status: str | None, provider: str | None, include_removed: bool,
                           as_json: bool) -> None:
    """List environments that are not removed (with --all, removed ones too)."""
    request = ListEnvironments(status=EnvironmentStatus(status) if status else None, provider=provider,
                               include_removed=include_removed)
    document = listing(settings, "environments", "list", request, "environments")

    def human(doc: dict[str, Any]) -> None:
        print_table(("ID", "STATUS", "PROVIDER", "THREADS", "PATH"),
                    ([e["id"], e["status"], e["providerId"], ",".join(e["threadIds"]), e["path"] or "-"]
                     for e in doc["environments"]))

    emit(document, as_json, human)


def _environment_command(verb: str, help_text: str, printer: Callable[[dict[str, Any]], None]) -> None:
    @environment.command(verb, help=help_text)
    @click.argument("environment_id")
    @json_option
    @click.pass_obj
    @run_command
    def command(settings: Settings, environment_id: str, as_json: bool) -> None:
        request = EnvironmentRef(environment_id=environment_id_argument(environment_id))
        emit(call(settings, "environments", verb, request, changes=verb != "show"), as_json, printer)


def _print_environment(e: dict[str, Any]) -> None:
    # Every text here may come from a provider, a hook's output or a path: printed as plain text
    # (a git message's '[rejected]' is no markup), with what would drive the terminal escaped.
    from rich.markup import escape

    message = f" — {one_line(e['statusMessage'])}" if e.get("statusMessage") else ""
    stdout.print(f"[bold]{e['id']}[/bold]  {e['status']}{escape(message)}")
    for label, value in (("provider", e["providerId"]), ("host", e["hostId"]), ("project", e["projectPath"]),
                         ("path", e["path"]), ("owns path", e["ownsPath"]), ("threads", ", ".join(e["threadIds"])),
                         ("setup", e["hooks"]["setup"]["status"]), ("teardown", e["hooks"]["teardown"]["status"])):
        stdout.print(f"  {label:<10} {one_line(str(value))}", markup=False)
    for line in e.get("transcript", []):
        stdout.print(f"  │ {one_line(line)}", markup=False)


def _print_accepted(doc: dict[str, Any]) -> None:
    stdout.print(f"{doc.get('environmentId') or '-'}  {doc.get('status') or ''}", markup=False)


_environment_command("show", "Show one environment, with the tail of its transcript.", _print_environment)
_environment_command("delete", "Retire now: cancel an in-flight create, tear down, remove.", _print_accepted)
_environment_command("retry", "Retry a failed create, or re-run a failed setup in the same workspace.", _print_accepted)


# -- threads ---------------------------------------------------------------------------------------


@cli.group()
def thread() -> None:
    """Spawn and manage threads."""


@thread.command("spawn")
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
    from nats.errors import Error as NatsError  # nats-py is imported once the URL is known: see _client_for

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
            from nats.errors import Error as NatsError  # imported by now: see _client_for

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


@thread.command("list")
@click.option("--environment", "environment_id")
@json_option
@click.pass_obj
@run_command
def thread_list(settings: Settings, environment_id: str | None, as_json: bool) -> None:
    """List threads."""
    request = ListThreads(environment_id=environment_id_argument(environment_id) if environment_id else None)

    def human(doc: dict[str, Any]) -> None:
        print_table(("THREAD", "STATUS", "ENVIRONMENT", "PARENT"),
                    ([t["id"], t["status"], t["environmentId"] or "-", t["parentThreadId"] or "-"] for t in doc["threads"]))

    emit(listing(settings, "threads", "list", request, "threads"), as_json, human)


def _thread_command(verb: str, help_text: str) -> None:
    @thread.command(verb, help=help_text)
    @click.argument("thread_id")
    @json_option
    @click.pass_obj
    @run_command
    def command(settings: Settings, thread_id: str, as_json: bool) -> None:
        request = ThreadRef(thread_id=id_argument("thread id", thread_id))
        emit(call(settings, "threads", verb, request, changes=True), as_json,
             _print_accepted)


_thread_command("archive", "Archive a thread; its environment retires after its last thread leaves.")
_thread_command("unarchive", "Unarchive a thread; inside the retire grace its environment is kept.")
_thread_command("cancel", "Cancel the thread's message; a preparing environment only it waits for is cancelled.")


# -- events ----------------------------------------------------------------------------------------


@cli.group()
def events() -> None:
    """Watch, export and replay the event log."""


@events.command("tail")
@click.argument("subject_filter", default=subjects.ENVIRONMENT_EVENTS)
@json_option
@click.pass_obj
@run_command
async def events_tail(settings: Settings, subject_filter: str, as_json: bool) -> None:
    """Print live events until interrupted."""
    _check_tail_filter(subject_filter)
    import asyncio  # only the commands that subscribe load it

    client = await open_client(settings)
    reader_left = asyncio.Event()

    async def show(message: Any) -> None:
        if as_json:
            line = message.data.decode()
        else:
            event = json.loads(message.data)
            line = one_line(f"{event.get('occurredAt', '')}  {message.subject}  {event.get('status', '')}")
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
    raise Failure("unreachable", "the connection to the bb service dropped and did not come back; "
                                 "tail again once the service is back")


def _check_tail_filter(subject_filter: str) -> None:
    """A filter the server would refuse (a malformed subject) or that reaches beyond what a client
    may read is a mistake to say at once, not a subscription that stays silent forever."""
    tokens = subject_filter.split(".")
    well_formed = all(token and not any(c.isspace() for c in token) for token in tokens) and ">" not in tokens[:-1]
    readable = [prefix.removesuffix(".>") for prefix in (subjects.ENVIRONMENT_EVENTS, subjects.TRANSCRIPT_EVENTS)]
    # Nothing is published on `bb.environments` itself: a filter needs a token beyond the prefix.
    if not well_formed or len(tokens) < 3 or ".".join(tokens[:2]) not in readable:
        raise Failure("invalid_input", f"subject filter {quoted(subject_filter)} is not one events tail can follow: give "
                                       f"a NATS subject under {' or '.join(p + '.>' for p in readable)}, "
                                       "e.g. 'bb.environments.*.ready'")


@events.command("export")
@json_option
@click.pass_obj
@run_command
async def events_export(settings: Settings, as_json: bool) -> None:
    """Print the whole log as JSON lines, in log order."""
    client = await open_client(settings)
    try:
        js = client.nc.jetstream()
        info = await js.stream_info(subjects.ENVIRONMENTS_STREAM)
        if info.state.messages == 0:
            return
        delivered, at = 0, 0  # messages the reader was given, and the stream sequence of the last
        async with contextlib.aclosing(client.read_stream(subjects.ENVIRONMENTS_STREAM, subjects.LOG_EVENTS, 10.0)) as log:
            async for messages in log:
                if not messages:
                    raise Failure("unreachable", f"the log stopped arriving after stream sequence {at} of "
                                                 f"{info.state.last_seq}; run the export again")
                for message in messages:
                    delivered, at = delivered + 1, message.metadata.sequence.stream
                    if message.metadata.sequence.consumer != delivered:  # lost on the way: a reconnect, say
                        raise Failure("unreachable", f"a message of the log was lost on the way before stream "
                                                     f"sequence {at}; run the export again")
                    sys.stdout.write(message.data.decode() + "\n")
                # The last sequence may be a message the relay deleted (one the store did not write).
                if at >= info.state.last_seq or messages[-1].metadata.num_pending == 0:
                    break
    finally:
        await client.close()


@events.command("replay")
@json_option
@click.pass_obj
@run_command
def events_replay(settings: Settings, as_json: bool) -> None:
    """Rebuild every read model from the event log; print the counts."""
    counts = call(settings, "events", "replay", Nothing(), changes=True)
    emit(counts, as_json, lambda c: stdout.print(
        f"replayed {c['events']} events: {c['environments']} environments, {c['threads']} threads", markup=False))


# -- Modal -----------------------------------------------------------------------------------------
# The commands load the Modal provider, so they are imported only to run or list them (LazyGroup);
# the groups are declared here, so that `bb --help` lists them without that.

MODAL_COMMANDS = "bb_environments.entrypoints.cli_modal"


@cli.group(cls=LazyGroup,
           lazy_subcommands={verb: f"{MODAL_COMMANDS}:machine_{verb}" for verb in ("create", "list", "remove")})
def machine() -> None:
    """Modal sandboxes outside any environment (tagged bb-machine=1)."""


@cli.group(cls=LazyGroup, lazy_subcommands={group: f"{MODAL_COMMANDS}:{group}" for group in ("account", "image")})
def modal() -> None:
    """The Modal account and the image sandboxes start from."""


def main() -> None:
    run_cli(cli, sys.argv[1:])


if __name__ == "__main__":  # `python -m bb_environments.entrypoints.cli`, as it was started before bb.py
    main()
