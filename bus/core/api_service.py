"""The request/reply API as a NATS micro service named `bb-environments`.

Each endpoint decodes its request struct, calls its handler and encodes the reply; an error
comes back as `{"error": {"code", "message"}}` (plus the micro-service error headers) with the
same codes the CLI turns into exit statuses. A request larger than MAX_REQUEST_BYTES, not JSON,
nested too deeply, or carrying a field its struct does not declare is `invalid_input` before its
handler runs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.micro import add_service
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from bb_environments.bus.health import describe, unavailable
from bb_environments.bus.micro_requests import sent_to_endpoint
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import ErrorBody, ErrorReply, Request
from bb_environments.bus.wire.refusals import refusal_reason

log = logging.getLogger(__name__)

API_VERSION = "1.0.0"
MAX_REQUEST_BYTES = 64 * 1024
"""Ample for any request (inputs and a prompt included); far below the NATS maximum payload."""


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


ErrorTranslator = Callable[[Exception], ApiError | None]


R = TypeVar("R", bound=Request)


@dataclass(frozen=True)
class Endpoint(Generic[R]):
    area: str
    verb: str
    request_type: type[R]
    handler: Callable[[R], Awaitable[msgspec.Struct]]


async def start_api(nc: Client, endpoints: list[Endpoint[Any]], translate: ErrorTranslator) -> Service:
    service = await add_service(
        nc, name=subjects.API_SERVICE, version=API_VERSION, description="bb environments lifecycle API"
    )
    for endpoint in endpoints:
        subject = subjects.api(endpoint.area, endpoint.verb)
        await service.add_endpoint(
            name=f"{endpoint.area}-{endpoint.verb}", subject=subject, handler=_serve(endpoint, subject, translate)
        )
    return service


def _serve(
    endpoint: Endpoint[R], subject: str, translate: ErrorTranslator
) -> Callable[[MicroRequest], Awaitable[None]]:
    async def serve(request: MicroRequest) -> None:
        if not sent_to_endpoint(request, subject):
            return
        try:
            body = _decode(request.data, endpoint.request_type)
        except ApiError as refused:
            await _respond_error(request, refused)
            return
        try:
            reply = await endpoint.handler(body)
        except Exception as error:
            known = translate(error)
            if known is None and isinstance(error, NatsError) and unavailable(error):
                # Not the request's fault nor a bug: the service's own way to JetStream is away.
                known = ApiError(
                    "unreachable",
                    f"the service cannot reach NATS JetStream just now ({describe(error)}); try again shortly",
                )
            if known is None:
                log.exception("%s.%s failed", endpoint.area, endpoint.verb)
                known = ApiError("failed", f"{type(error).__name__}: {error}")
            await _respond_error(request, known)
        else:
            await request.respond(msgspec.json.encode(reply))

    return serve


def _decode(data: bytes | None, request_type: type[R]) -> R:
    if data and len(data) > MAX_REQUEST_BYTES:
        raise ApiError("invalid_input", f"the request has {len(data)} bytes; at most {MAX_REQUEST_BYTES} are accepted")
    try:
        return msgspec.json.decode(data or b"{}", type=request_type)
    except msgspec.DecodeError as malformed:  # named as a thread event's refusal is: one line, whatever was sent
        raise ApiError("invalid_input", f"malformed request: {refusal_reason(malformed)}") from None
    except RecursionError:  # 64 KiB of brackets nest deeper than the decoder may recurse
        raise ApiError("invalid_input", "malformed request: it nests too deeply") from None


async def _respond_error(request: MicroRequest, error: ApiError) -> None:
    body = msgspec.json.encode(ErrorReply(ErrorBody(error.code, error.message)))
    await request.respond_error(error.code, error.message.replace("\n", " ")[:1000], data=body)
