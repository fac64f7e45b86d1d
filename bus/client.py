"""The caller's side of the API: find the running service, send a request, decode the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeout

from bus import subjects
from bus.api_messages import ErrorReply, Request

ERROR_CODE_HEADER = "Nats-Service-Error-Code"


class ServiceError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def unreachable(detail: str, data_dir: Path | None = None, hint: str | None = None) -> ServiceError:
    where = f" for data dir {data_dir}" if data_dir else ""
    return ServiceError("unreachable",
                        f"the bb service{where} is unreachable ({detail}); {hint or 'start it with `bb serve`'}")


class ApiClient:
    def __init__(self, nc: Client) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, url: str, data_dir: Path | None = None, **options: Any) -> ApiClient:
        errors: list[Exception] = []

        async def remember(error: Exception) -> None:
            errors.append(error)

        try:
            nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=1, reconnect_time_wait=0.1,
                                    error_cb=remember, **options)
        except (NoServersError, OSError, NatsTimeout, NatsError) as error:
            # A refusal of our credentials ('Authorization Violation') reaches only the error callback
            # once the client has given up on the server: name it rather than the giving up.
            refused = next((e for e in errors if "violation" in str(e).lower()), None)
            if refused is not None or (isinstance(error, NatsError) and "violation" in str(error).lower()):
                reason = str(refused or error).removeprefix("nats: ").strip("'")
                raise unreachable(f"{url} refused the connection: {reason}", data_dir) from None
            raise unreachable(f"cannot connect to {url}: {type(error).__name__}", data_dir) from None
        return cls(nc)

    async def call(self, area: str, verb: str, body: Request, timeout: float = 60) -> dict[str, Any]:
        try:
            reply = await self.nc.request(subjects.api(area, verb), msgspec.json.encode(body), timeout=timeout)
        except NoRespondersError:
            raise unreachable("nothing answers the API") from None
        except NatsTimeout:
            raise ServiceError("failed", f"the service did not answer {area} {verb} within {timeout:.0f} s") from None
        if reply.headers and ERROR_CODE_HEADER in reply.headers:
            error = msgspec.json.decode(reply.data, type=ErrorReply).error
            raise ServiceError(error.code, error.message)
        return msgspec.json.decode(reply.data)

    async def close(self) -> None:
        await self.nc.close()

