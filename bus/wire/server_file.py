"""server.json, the file by which every client finds the embedded default: its shape, how it is
read, and where the data dir that holds it is. Here, not with the service's settings, so that the
typed client (bb_environments.client) finds the service loading nothing but the wire.

Without `from __future__ import annotations`: msgspec reads a Struct's annotations when it first
decodes one, and a string annotation costs it a compile() each (see entrypoints/config.py).
"""

import os

import msgspec

DEFAULT_DATA_DIR = os.path.join("~", ".local", "share", "bb")
SERVER_FILE = "server.json"


def nats_servers(url: str) -> list[str]:
    """The servers a NATS URL names: one, or a cluster's, comma-separated (BB_NATS_URL, `--nats-url`)."""
    return [server.strip() for server in url.split(",") if server.strip()]


class ClientSeeds(msgspec.Struct, frozen=True):
    operator: str
    publisher: str
    subscriber: str


class ServerInfo(msgspec.Struct, rename="camel", omit_defaults=True, frozen=True):
    """server.json: how every other `bb` command finds the running service (SPEC section 2). The
    service writes every field it has; a reader needs only the first two."""

    nats_url: str
    pid: int
    host_id: str | None = None
    data_dir: str | None = None
    nats_pid: int | None = None
    nats_port: int | None = None
    credentials: ClientSeeds | None = None


class ServerFileError(Exception):
    """server.json is missing or cannot be used; the message says which, in a few words."""


class DataDirError(ValueError):
    """The data dir named cannot be used; the message says why and what to do."""


def data_root(given: str | None = None) -> str:
    """The data dir, absolute with symlinks resolved: `given`, else BB_DATA_DIR, else the default."""
    named = given or os.environ.get("BB_DATA_DIR") or DEFAULT_DATA_DIR
    expanded = os.path.expanduser(named)
    if expanded.startswith("~"):  # left as it was: taken as relative, it would name a dir under the cwd
        raise DataDirError(
            f"the data dir {named!r} names a home directory that cannot be found: "
            "set BB_DATA_DIR (or `bb serve --data-dir`) to an absolute path"
        )
    return os.path.realpath(expanded)


def read_server_file(path: "str | os.PathLike[str]") -> ServerInfo:
    """The running service's server.json, checked for its shape, or ServerFileError."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as file:
            content = file.read()
    except FileNotFoundError:
        raise ServerFileError(f"no {name}") from None
    except OSError as unreadable:
        raise ServerFileError(f"{name} cannot be read: {unreadable.strerror}") from None
    try:
        return msgspec.json.decode(content, type=ServerInfo)
    except msgspec.DecodeError as damaged:
        raise ServerFileError(f"{name} is damaged: {damaged}") from None
