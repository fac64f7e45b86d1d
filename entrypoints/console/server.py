"""The console's web server (aiohttp): the pages, their live feeds as server-sent events, and the
static script and style, all behind one token made for this run.

The token arrives once in the URL `bb console` prints (as Jupyter's does); the server keeps it in
a cookie for this port and sends the browser on to the same address without it, so that it stays
out of the address bar, the history and any Referer. No request is logged (the access log would
hold the token)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from html import escape
from ipaddress import ip_address
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from bb_environments.bus.wire.service_errors import ServiceError
from bb_environments.entrypoints.config import Settings
from bb_environments.entrypoints.console.feeds import FleetFeed, Update, environment_updates
from bb_environments.entrypoints.console.service import Service
from bb_environments.entrypoints.console.views import environment_page, environment_parts, fleet_page, page

STATIC = Path(__file__).with_name("static")
HEARTBEAT_S = 15.0
"""A feed with nothing to say sends a comment this often: a page that left is noticed, and no proxy
between takes the stream for dead."""
HEADERS = {
    # Only what this server sends runs or loads; the timeline's bars are placed by style attributes.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
TOKEN_KEY = web.AppKey("token", str)
FEED_KEY = web.AppKey("fleet", FleetFeed)
SERVICE_KEY = web.AppKey("service", Service)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def url(bind: str, port: int, token: str) -> str:
    host = f"[{bind}]" if ":" in bind else bind
    return f"http://{host}:{port}/?token={token}"


def is_loopback(bind: str) -> bool:
    with contextlib.suppress(ValueError):
        return ip_address(bind).is_loopback
    return bind == "localhost"


def application(service: Service, feed: FleetFeed, token: str, port: int) -> web.Application:
    app = web.Application(middlewares=[_guard(token, f"bb-console-{port}")])
    app[TOKEN_KEY], app[FEED_KEY], app[SERVICE_KEY] = token, feed, service
    app.router.add_get("/", _fleet)
    app.router.add_get("/live/fleet", _fleet_live)
    app.router.add_get("/environments/{environment_id}", _environment)
    app.router.add_get("/live/environments/{environment_id}", _environment_live)
    app.router.add_static("/static", STATIC)
    app.on_response_prepare.append(_secure_headers)
    return app


def _guard(token: str, cookie: str) -> Middleware:
    expected = token.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        offered = request.query.get("token") or request.cookies.get(cookie) or _bearer(request)
        if offered is None or not hmac.compare_digest(offered.encode(), expected):
            return web.Response(
                status=401,
                text="401 Unauthorized: open the address `bb console` printed, with its token.\n",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if "token" in request.query and request.method == "GET":
            onward = request.rel_url.with_query([(k, v) for k, v in request.query.items() if k != "token"])
            response = web.Response(status=303, headers={"Location": str(onward)})
            response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
            return response
        return await handler(request)

    return guard


def _bearer(request: web.Request) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() in ("bearer", "token") and credentials else None


async def _secure_headers(_: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)


async def _fleet(request: web.Request) -> web.Response:
    return _html(fleet_page(request.app[FEED_KEY].parts))


async def _fleet_live(request: web.Request) -> web.StreamResponse:
    return await _stream(request, request.app[FEED_KEY].updates())


async def _environment(request: web.Request) -> web.Response:
    service, environment_id = request.app[SERVICE_KEY], request.match_info["environment_id"]
    try:
        shown = await service.environment(environment_id)
        history = await service.history(shown["id"])
    except ServiceError as refused:
        return _refusal(refused)
    return _html(environment_page(shown["id"], environment_parts(shown, history, datetime.now(UTC))))


async def _environment_live(request: web.Request) -> web.StreamResponse:
    updates = environment_updates(request.app[SERVICE_KEY], request.match_info["environment_id"])
    try:
        first = await anext(updates)
    except ServiceError as refused:
        await updates.aclose()
        return _refusal(refused)

    async def everything() -> AsyncGenerator[Update, None]:
        yield first
        async for update in updates:
            yield update

    return await _stream(request, everything())


def _refusal(refused: ServiceError) -> web.Response:
    status = {"not_found": 404, "invalid_input": 400}.get(refused.code, 503)
    body = f'<section><p class="problem">{escape(refused.message)}</p><p><a href="/">← fleet</a></p></section>'
    return _html(page("not shown", "", body), status)


async def _stream(request: web.Request, updates: AsyncGenerator[Update, None]) -> web.StreamResponse:
    """Server-sent events: each update as it comes, a comment when none came for HEARTBEAT_S."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    pending: asyncio.Task[Update] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(anext(updates))
            done, _ = await asyncio.wait({pending}, timeout=HEARTBEAT_S)
            if not done:
                await response.write(b": still here\n\n")
                continue
            event, data = pending.result()
            pending = None
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
    except (ConnectionResetError, StopAsyncIteration):  # the page left, or the feed ended
        return response
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
        await updates.aclose()


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html")


async def serve(settings: Settings, port: int, bind: str, announce: Callable[[str, int], None]) -> None:
    """Serve until cancelled; `announce(url, port)` once it listens. Fails (ServiceError) at once
    when the service cannot be reached, like every other command."""
    service = Service(settings)
    await service.client()
    feed = FleetFeed(service)
    await feed.refresh()
    token = new_token()
    # Bound first: the cookie is named after the port, which may be the one the system chose.
    listener = socket.create_server((bind, port), family=socket.AF_INET6 if ":" in bind else socket.AF_INET)
    listening = int(listener.getsockname()[1])
    refreshing = asyncio.create_task(feed.run())
    runner = web.AppRunner(application(service, feed, token, listening), access_log=None, handle_signals=False)
    try:
        await runner.setup()
        await web.SockSite(runner, listener).start()
        announce(url(bind, listening, token), listening)
        await asyncio.Event().wait()
    finally:
        refreshing.cancel()
        await runner.cleanup()
        listener.close()
        await service.close()
