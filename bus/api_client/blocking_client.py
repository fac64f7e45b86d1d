"""The API's requests over one plain socket to the embedded nats-server, without asyncio or nats-py.

A `bb` command that only asks the service and prints the answer (a listing, `show`, `archive`)
spends most of its life importing: asyncio and nats-py (which loads its JetStream API, and
importlib.metadata for its own version) take longer than the whole command's work. For the server
`bb serve` runs, whose address and the operator's seed server.json names, the handful of protocol
lines a request needs are written here: INFO, CONNECT signed with the seed's NKEY, PING/PONG, one
SUB on an inbox, PUB, and the MSG or HMSG of the answer. Anything else (an external NATS with TLS,
credentials files or a cluster to reconnect to; subscriptions) stays with nats-py (bus/api_client/nats_client.py).

It answers as bus/api_client/nats_client.py's ApiClient does: the service's refusal as ServiceError, an answer
that cannot come as AnswerLost (the connection dropped, the service's process ended, the timeout),
a server that cannot be reached or refuses the credentials as `unreachable`. Every line the
server sends is checked for its shape: a malformed one ends the command as a failed connection.
"""

from __future__ import annotations

# The socket module's own module, not `socket`: that one builds four IntEnums of every constant of
# this one when it is imported, 5 ms of a `bb` command, and loads selectors; what a request needs
# (a TCP socket with timeouts) is all here.
import _socket
import json
import os
import time
from typing import Any

import msgspec

from bb_environments.bus.api_client.nkey_signer import SeedError, answer_nonce, user_seed
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import Request, decode_answer
from bb_environments.bus.wire.service_errors import SERVICE_CHECK_S, AnswerLost, refused_request, unreachable
from bb_environments.providers.host.processes import pid_alive

NO_RESPONDERS_STATUS = "503"
CONNECT_TIMEOUT_S = 2.0
MAX_PAYLOAD = 64 * 1024 * 1024
"""The most a message may carry whatever the server says: what a CLI would buffer for one answer."""
MAX_LINE = 64 * 1024
"""A protocol line (not a payload) longer than this is not one the server would send."""


class _Closed(Exception):
    """The connection ended or failed; the message says how, in a few words."""


class _TimedOut(Exception):
    pass


class _Refused(Exception):
    """The server refused what was sent (a permissions violation): it never reached the service."""


class BlockingApiClient:
    def __init__(self, connection: _socket.socket, url: str, service_pid: int | None, max_payload: int) -> None:
        self._socket = connection
        self._url = url
        self._service_pid = service_pid
        self._max_payload = max_payload
        self._buffer = bytearray()
        self._inbox = f"_INBOX.{os.urandom(12).hex()}"
        self._requests = 0

    @classmethod
    def connect(
        cls, url: str, seed_file: str, data_dir: str | None = None, service_pid: int | None = None
    ) -> BlockingApiClient:
        """Connected and authenticated as the NKEY whose seed is in `seed_file`, with its inbox subscribed."""
        try:
            with open(seed_file, "rb") as file:
                seed = user_seed(file.read().strip())
        except OSError as error:
            raise unreachable(f"cannot connect to {url}: {type(error).__name__}", data_dir) from None
        except SeedError as bad:
            raise unreachable(
                f"cannot connect to {url}: {seed_file} is not a user's NKEY seed ({bad})", data_dir
            ) from None
        try:
            try:
                connection = _connected(*_address(url))
            except (OSError, ValueError) as error:
                raise unreachable(f"cannot connect to {url}: {type(error).__name__}", data_dir) from None
            client = cls(connection, url, service_pid, max_payload=0)
            try:
                client._handshake(seed, time.monotonic() + CONNECT_TIMEOUT_S, data_dir)
            except BaseException:
                client.close()
                raise
        finally:
            seed[:] = bytes(len(seed))
        return client

    def _handshake(self, seed: bytearray, deadline: float, data_dir: str | None) -> None:
        try:
            info = self._info(self._line(deadline))
            if info.get("tls_required") or not isinstance(info.get("nonce"), str):
                raise _Closed("it asks for TLS or offers no NKEY nonce, unlike the embedded server")
            advertised = info.get("max_payload")
            self._max_payload = (
                min(advertised, MAX_PAYLOAD) if isinstance(advertised, int) and advertised > 0 else MAX_PAYLOAD
            )
            public_key, signature = answer_nonce(seed, info["nonce"].encode())
            options = {
                "verbose": False,
                "pedantic": False,
                "lang": "python3",
                "version": "bb",
                "protocol": 1,
                "headers": True,
                "no_responders": True,
                "nkey": public_key,
                "sig": signature,
            }
            self._send(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
            while (line := self._line(deadline)) != b"PONG":
                if line.startswith(b"-ERR"):
                    raise unreachable(f"{self._url} refused the connection: {_error_reason(line)}", data_dir)
                self._answer_control(line)
            self._send(f"SUB {self._inbox}.* 1\r\n".encode())
        except _Closed as closed:
            raise unreachable(f"cannot connect to {self._url}: {closed}", data_dir) from None
        except _TimedOut:
            raise unreachable(
                f"cannot connect to {self._url}: no answer within {CONNECT_TIMEOUT_S:.0f} s", data_dir
            ) from None

    def call(self, area: str, verb: str, body: Request, timeout: float = 60) -> dict[str, Any]:
        what = f"{area} {verb}"
        payload = msgspec.json.encode(body)
        if self._max_payload and len(payload) > self._max_payload:
            raise unreachable(
                f"the connection to it failed: the request is larger than its {self._max_payload} bytes per message"
            )
        self._requests += 1
        inbox = f"{self._inbox}.{self._requests}"
        deadline = time.monotonic() + timeout
        try:
            self._send(f"PUB {subjects.api(area, verb)} {inbox} {len(payload)}\r\n".encode() + payload + b"\r\n")
            status, headers, data = self._answer(inbox, deadline)
        except _Refused as refusal:
            raise refused_request(f"{self._url} refused the request: {refusal}") from None
        except _Closed:
            raise AnswerLost(f"the connection to the bb service dropped before it answered {what}") from None
        except _TimedOut:
            if self._service_pid is not None and not pid_alive(self._service_pid):
                raise AnswerLost(f"the bb service (pid {self._service_pid}) ended before it answered {what}") from None
            raise AnswerLost(f"the bb service did not answer {what} within {timeout:.0f} s") from None
        if status == NO_RESPONDERS_STATUS:
            raise unreachable("nothing answers the API")
        return decode_answer(headers, data)

    def close(self) -> None:
        self._socket.close()

    def _answer(self, inbox: str, deadline: float) -> tuple[str, dict[str, str], bytes]:
        """The status (empty without one), headers and payload of the first message to `inbox`."""
        while True:
            line = self._line(deadline)
            if line.startswith((b"MSG ", b"HMSG ")):
                fields = line.split(b" ")
                has_headers = fields[0] == b"HMSG"
                # MSG <subject> <sid> [reply] <size>; HMSG <subject> <sid> [reply] <header size> <size>
                if len(fields) not in ((5, 6) if has_headers else (4, 5)) or not all(
                    f.isdigit() for f in fields[-2 if has_headers else -1 :]
                ):
                    raise _Closed(f"a malformed message line {line[:80]!r}")
                size = int(fields[-1])
                header_size = int(fields[-2]) if has_headers else 0
                if header_size > size or (self._max_payload and size > self._max_payload):
                    raise _Closed(f"a malformed message line {line[:80]!r}")
                block = self._exactly(size + 2, deadline)
                if block[size:] != b"\r\n":
                    raise _Closed(f"a message longer than its line {line[:80]!r} says")
                if fields[1].decode(errors="replace") == inbox:
                    return *_headers(block[:header_size]), block[header_size:size]
                continue  # the late answer of an earlier request of this connection
            if line.startswith(b"-ERR"):
                reason = _error_reason(line)
                # The one error after which the server keeps the connection: nothing was delivered.
                raise (_Refused if reason.lower().startswith("permissions violation") else _Closed)(reason)
            self._answer_control(line)

    def _answer_control(self, line: bytes) -> None:
        if line == b"PING":
            self._send(b"PONG\r\n")
        elif not (line in (b"PONG", b"+OK") or line.startswith(b"INFO ")):
            raise _Closed(f"an unknown protocol line {line[:80]!r}")

    @staticmethod
    def _info(line: bytes) -> dict[str, Any]:
        try:
            info = json.loads(line.removeprefix(b"INFO ")) if line.startswith(b"INFO ") else None
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise _Closed("not a NATS server")
        return info

    def _send(self, data: bytes) -> None:
        try:
            self._socket.settimeout(CONNECT_TIMEOUT_S)  # not the few milliseconds a read may have left
            self._socket.sendall(data)
        except OSError as error:
            raise _Closed(type(error).__name__) from None

    def _line(self, deadline: float) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > MAX_LINE:
                raise _Closed("a protocol line too long")
            self._fill(deadline)
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    def _exactly(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            self._fill(deadline)
        block = bytes(self._buffer[:size])
        del self._buffer[:size]
        return block

    def _fill(self, deadline: float) -> None:
        """More bytes from the server; waits in steps, so that a request whose service ended is not
        left waiting for the whole timeout."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _TimedOut()
            self._socket.settimeout(min(remaining, SERVICE_CHECK_S))
            try:
                chunk = self._socket.recv(1 << 20)
            except TimeoutError:
                if self._service_pid is not None and not pid_alive(self._service_pid):
                    raise _TimedOut() from None
                continue
            except OSError as error:
                raise _Closed(type(error).__name__) from None
            if not chunk:
                raise _Closed("closed by the server")
            self._buffer += chunk
            return


def _address(url: str) -> tuple[str, int]:
    """The host and port of the embedded server's `nats://127.0.0.1:PORT` (as urllib.parse.urlsplit
    reads any URL of that shape, held to it by a test), parsed here: urllib.parse loads ipaddress,
    which takes longer than connecting. A port that is not one raises ValueError, as urllib's does."""
    authority = url.partition("://")[2]
    for end in "/?#":
        authority = authority.partition(end)[0]
    authority = authority.rpartition("@")[2]
    host, port = authority, ""
    if not authority.endswith("]") and ":" in authority:
        host, _, port = authority.rpartition(":")
    host = host.removeprefix("[").removesuffix("]").lower()
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"port {port!r} is not a port number")
    return host or "127.0.0.1", int(port or 0) or 4222


def _connected(host: str, port: int) -> _socket.socket:
    """A TCP connection, without socket.create_connection: its getaddrinfo encodes the host with the
    idna codec, whose import (unicodedata, stringprep) takes longer than connecting; server.json
    names an address (127.0.0.1), which connect() takes as it is."""
    connection = _socket.socket(_socket.AF_INET6 if ":" in host else _socket.AF_INET, _socket.SOCK_STREAM)
    try:
        # Without it Nagle holds the request back until the server acknowledges the subscription
        # sent just before, which it delays: 40 ms, as long as the rest of the command.
        connection.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        connection.settimeout(CONNECT_TIMEOUT_S)
        connection.connect((host, port))
    except BaseException:
        connection.close()
        raise
    return connection


def _error_reason(line: bytes) -> str:
    """What `-ERR '<reason>'` says."""
    return line.removeprefix(b"-ERR").strip().strip(b"'").decode(errors="replace")


def _headers(block: bytes) -> tuple[str, dict[str, str]]:
    """NATS headers' status code (empty without one) and fields: `NATS/1.0[ <status>[ <description>]]`,
    then `Name: value` lines."""
    if not block:
        return "", {}
    status_line, *lines = block.decode(errors="replace").split("\r\n")
    headers = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip()] = value.strip()
    return status_line.removeprefix("NATS/1.0").strip().split(" ", 1)[0], headers
