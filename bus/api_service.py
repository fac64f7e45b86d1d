"""The request/reply API as a NATS micro service named `bb-environments`.

Each endpoint decodes its request struct, calls its handler and encodes the reply; an error
comes back as `{"error": {"code", "message"}}` (plus the micro-service error headers) with the
same codes the CLI turns into exit statuses.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request as MicroRequest
from nats.micro.service import Service

from bus import subjects
from bus.api_messages import ErrorBody, ErrorReply, Request

log = logging.getLogger(__name__)

API_VERSION = "1.0.0"


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


ErrorTranslator = Callable[[Exception], ApiError | None]


@dataclass(frozen=True)
class Endpoint:
    area: str
    verb: str
    request_type: type[Request]
    handler: Callable[[Request], Awaitable[msgspec.Struct]]


async def start_api(nc: Client, endpoints: list[Endpoint], translate: ErrorTranslator) -> Service:
    service = await add_service(
        nc, name=subjects.API_SERVICE, version=API_VERSION, description="bb environments lifecycle API"
    )
    for endpoint in endpoints:
        await service.add_endpoint(
            name=f"{endpoint.area}-{endpoint.verb}", subject=subjects.api(endpoint.area, endpoint.verb),
            handler=_serve(endpoint, translate),
        )
    return service


def _serve(endpoint: Endpoint, translate: ErrorTranslator) -> Callable[[MicroRequest], Awaitable[None]]:
    async def serve(request: MicroRequest) -> None:
        try:
            body = msgspec.json.decode(request.data or b"{}", type=endpoint.request_type)
            reply = await endpoint.handler(body)
        except msgspec.ValidationError as malformed:
            await _respond_error(request, ApiError("invalid_input", f"malformed request: {malformed}"))
        except Exception as error:
            known = translate(error)
            if known is None:
                log.exception("%s.%s failed", endpoint.area, endpoint.verb)
                known = ApiError("failed", f"{type(error).__name__}: {error}")
            await _respond_error(request, known)
        else:
            await request.respond(msgspec.json.encode(reply))

    return serve


async def _respond_error(request: MicroRequest, error: ApiError) -> None:
    body = msgspec.json.encode(ErrorReply(ErrorBody(error.code, error.message)))
    await request.respond_error(error.code, error.message.replace("\n", " ")[:1000], data=body)
