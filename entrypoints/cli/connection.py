"""How a command reaches the service: the embedded server's server.json or an external NATS, and
the blocking client or nats-py's. A command that only sends requests and prints their answers
goes through `call` or `listing`, over a plain socket where it can (see `requests_to`)."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from bb_environments.bus.wire.api_messages import MAX_PAGE, ListEnvironments, ListHistory, ListThreads, Request
from bb_environments.bus.wire.server_file import ServerFileError, ServerInfo, read_server_file
from bb_environments.bus.wire.service_errors import AnswerLost, unreachable
from bb_environments.entrypoints.cli.support import Failure, event_loop
from bb_environments.entrypoints.config import Settings, nats_credentials, serving

if TYPE_CHECKING:  # imported by open_client, once the URL is known
    from bb_environments.bus.api_client.nats_client import ApiClient

R = TypeVar("R", bound=Request)


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
        return await _client_for(settings.nats_url).connect(
            settings.nats_url, settings.data_root, **nats_credentials(settings.nats_url)
        )
    if server.credentials is None:
        return await _client_for(server.nats_url).connect(
            server.nats_url, settings.data_root, **nats_credentials(server.nats_url)
        )
    # The embedded server's service runs on this machine: a request it can no longer answer (its
    # process ended) fails at once, not after the timeout.
    return await _client_for(server.nats_url).connect(
        server.nats_url, settings.data_root, service_pid=server.pid, nkeys_seed=server.credentials.operator
    )


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

        client = BlockingApiClient.connect(server.nats_url, server.credentials.operator, settings.data_root, server.pid)
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
            raise may_have_taken_effect(lost) from None


def may_have_taken_effect(lost: AnswerLost) -> AnswerLost:
    """The lost answer of a request that changes something, which may have happened all the same."""
    return AnswerLost(f"{lost.message}; it may have taken effect all the same")


def listing(
    settings: Settings, area: str, verb: str, request: ListEnvironments | ListThreads | ListHistory, key: str
) -> dict[str, Any]:
    """Every page of a listing, as one document `{key: [...]}` (the API pages; see docs/bus.md). Pages
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


def sendable(request: R) -> R:
    """The request, if JSON can carry it: an argument that is not UTF-8 (bytes of a file name, say)
    is refused naming it, rather than failing the encoding on the way out."""
    for name in request.__struct_fields__:
        try:
            msgspec.json.encode(getattr(request, name))
        except UnicodeEncodeError:
            raise Failure(
                "invalid_input", f"the {name.replace('_', ' ')} is not UTF-8 text; pass it as UTF-8"
            ) from None
    return request
