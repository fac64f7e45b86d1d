"""Settings (flag beats environment variable beats default) and the running service's server.json.

Without `from __future__ import annotations`: msgspec reads a Struct's annotations when it first
decodes one, and a string annotation costs it a compile() each; every `bb` command that connects
decodes server.json (ServerInfo), and those compiles were a tenth of a request's run time. The
few annotations that name Path are strings all the same (no struct that is decoded has one):
pathlib loads urllib.parse and ipaddress, about a tenth of a `bb` command that only sends a
request, which needs neither (see Settings.data_root).
"""

import os
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from bb_environments.bus.wire.server_file import SERVER_FILE, DataDirError, ServerInfo, data_root, nats_servers
from bb_environments.entrypoints import setting_values as read
from bb_environments.entrypoints.setting_values import (
    ConfigError as ConfigError,  # raised and caught by its users as config's
)
from bb_environments.providers.host.durable_files import write_durably

if TYPE_CHECKING:  # nats-py, imported by `bb` only once it knows the URL (entrypoints/cli/connection.py)
    import logging
    from pathlib import Path

    from bb_environments.bus.jetstream import ConnectOptions
    from bb_environments.hooks.records import SyncLevel
    from bb_environments.providers.host.containment import Limits
    from bb_environments.providers.host.workspace_user import WorkspaceUser

SERVE_LOCK = "serve.lock"
THREADS_MAX_AGE_S = 7 * 24 * 3600
THREADS_MAX_BYTES = 1 << 30
REMOVED_RETENTION_S = 7 * 24 * 3600
SAVED_REF_RETENTION_S = 30 * 24 * 3600
MAX_PIDS_PER_ENVIRONMENT = 4096
"""Far above what a setup's build (make -j, npm, a test database) runs at once, far below the
host's pid_max (32768 by default): a fork bomb in one environment leaves the others room."""
MAX_MEMORY_PER_ENVIRONMENT = 8 << 30
"""Enough for a large build or a dev server with its database; on a host with less memory it
still keeps one environment from setting off the host's OOM killer against the others."""
MIN_PIDS_PER_ENVIRONMENT = 16
"""The hook's supervisor (two threads), bash and a few commands."""
MIN_MEMORY_PER_ENVIRONMENT = 64 << 20
"""The hook's supervisor (a Python process) and bash, with room for a small command."""


class Settings(msgspec.Struct, frozen=True):
    """What a `bb` command or the service runs with. A Struct, not a dataclass: making a dataclass
    (its generated methods compiled) took a millisecond of every command's start."""

    data_root: str
    """The data dir, absolute, symlinks resolved: as text, all that a command which only sends
    requests needs of it (`data_dir` is the same as a Path)."""
    nats_url: str | None
    event_store: str
    host_id: str
    retire_grace_override: tuple[int | None] | None
    """(grace,) overrides every provider's grace, `(None,)` meaning never (tests use `(0,)`)."""
    hook_timeout_s: float
    sweep_interval_s: float
    transient_retry_s: float
    extra_providers: tuple[str, ...]
    """`module:Class` providers loaded besides the installed ones (BB_EXTRA_PROVIDERS, comma-separated)."""
    threads_max_age_s: float
    threads_max_bytes: int
    """Retention of stream BB_THREADS, whose messages carry prompts (BB_THREADS_MAX_AGE_S / _MAX_BYTES)."""
    removed_retention_s: float
    """How long a removed environment's hook records, transcript, read-model row and log stream messages
    are kept (BB_REMOVED_RETENTION_S, see hooks.ledger, bus/core/retention.py and docs/guarantees.md, Retention)."""
    saved_ref_retention_s: float
    """How long the work saved from a removed worktree (refs/bb/saved/<id>) is kept (BB_SAVED_REF_RETENTION_S)."""
    doctor_interval_s: float = 3600
    """How often the sweep looks for what `bb doctor` would find, to log it (BB_DOCTOR_INTERVAL_S)."""
    agent_root: str | None = None
    """BB_AGENT_ROOT: where this host's providers put the workspaces they own (`bb agent --root`); for
    `bb serve`'s own agent None keeps them under the data dir, as earlier releases did."""
    nats_port: int | None = None
    """The embedded nats-server's port as asked for (`bb serve --nats-port`, BB_NATS_PORT); None leaves
    it to the port the data dir remembers (bus/embedded_server.py)."""
    max_live_environments: int = 10_000
    """How many environments that are not removed one host may have (BB_MAX_LIVE_ENVIRONMENTS)."""
    max_live_environments_per_project: int = 1_000
    """How many of them one project may have (BB_MAX_LIVE_ENVIRONMENTS_PER_PROJECT)."""
    pool_max_failures: int = 3
    """After how many member setups failed in a row a warm pool pauses (BB_POOL_MAX_FAILURES)."""
    port_range: tuple[int, int] = (20000, 29999)
    """The ports each host leases environments' blocks from, first and last (BB_PORT_RANGE `first-last`)."""
    ports_per_environment: int = 10
    """How many consecutive ports each environment leases (BB_PORTS_PER_ENVIRONMENT)."""
    project_roots: tuple[str, ...] | None = None
    """The directories a project must lie in (BB_PROJECT_ROOTS, colon-separated, absolute); None: anywhere."""
    workspace_user: str | None = None
    """The user that owns the agent's workspaces and runs their hooks (BB_WORKSPACE_USER); None: the
    agent's own user, whose credentials the hooks can then read (SPEC 9)."""
    replica_id: str = "local"
    """Which core replica this `bb serve` is among those sharing one store and one NATS
    (`--replica-id`, BB_REPLICA_ID; default the host id). Two running with one id are refused."""
    stream_replicas: int = 1
    """The replica count of every stream and bucket the service creates (BB_STREAM_REPLICAS): 3 on a
    3-node NATS cluster, 1 on the embedded server."""
    default_host: str | None = None
    """The host a spawn that names none goes to (BB_DEFAULT_HOST); None: this service's own host,
    while an agent serves it (its own, or a `bb agent` of that id), and otherwise such a spawn is refused."""
    run_git_hooks: bool = False
    """BB_GIT_HOOKS=run: a setup first runs the post-checkout hook its workspace's checkout owes
    (providers/git_commands.py); off, the repository's git hooks never run."""
    max_pids_per_environment: int = MAX_PIDS_PER_ENVIRONMENT
    """BB_MAX_PIDS_PER_ENVIRONMENT: the processes (and threads) one environment's hooks, and what
    they leave running, may have at once, where a cgroup holds them to it (providers/host/containment.py)."""
    max_memory_per_environment: int = MAX_MEMORY_PER_ENVIRONMENT
    """BB_MAX_MEMORY_PER_ENVIRONMENT: the bytes of memory they may use together, likewise."""
    saved_work_max_bytes: int = 10 << 20
    """BB_SAVED_WORK_MAX_BYTES: the largest file the work saved from a removed worktree keeps
    (providers/saved_work.py, which reads it there too)."""
    disk_scan_interval_s: float = 600
    """BB_DISK_SCAN_INTERVAL_S: how often each live workspace's size is measured again (SPEC 11)."""
    max_disk_bytes_per_project: int | None = None
    """BB_MAX_DISK_BYTES_PER_PROJECT: the bytes one project's live workspaces on a host may take,
    as last measured, before its spawns are refused; None: no budget."""

    @classmethod
    def load(
        cls,
        data_dir: str | None = None,
        nats_url: str | None = None,
        nats_port: str | None = None,
        replica_id: str | None = None,
    ) -> "Settings":
        try:
            root = data_root(data_dir)
        except DataDirError as unusable:
            raise ConfigError(str(unusable)) from None
        host_id = read.host_id(os.environ.get("BB_HOST_ID", "local"))
        return cls(
            data_root=root,
            nats_url=nats_url or os.environ.get("BB_NATS_URL") or None,
            event_store=os.environ.get("BB_EVENT_STORE") or f"sqlite:///{os.path.join(root, 'events.sqlite')}",
            host_id=host_id,
            retire_grace_override=read.grace_override(os.environ.get("BB_RETIRE_GRACE_MS")),
            hook_timeout_s=read.number("BB_HOOK_TIMEOUT_S", 900),
            sweep_interval_s=read.number("BB_SWEEP_INTERVAL_S", 30),
            transient_retry_s=read.number("BB_TRANSIENT_RETRY_S", 30),
            extra_providers=tuple(p for p in os.environ.get("BB_EXTRA_PROVIDERS", "").split(",") if p),
            threads_max_age_s=read.positive("BB_THREADS_MAX_AGE_S", THREADS_MAX_AGE_S, "a number of seconds"),
            threads_max_bytes=int(read.positive("BB_THREADS_MAX_BYTES", THREADS_MAX_BYTES, "a number of bytes")),
            removed_retention_s=read.positive("BB_REMOVED_RETENTION_S", REMOVED_RETENTION_S, "a number of seconds"),
            saved_ref_retention_s=read.positive(
                "BB_SAVED_REF_RETENTION_S", SAVED_REF_RETENTION_S, "a number of seconds"
            ),
            doctor_interval_s=read.positive("BB_DOCTOR_INTERVAL_S", 3600, "a number of seconds"),
            agent_root=os.path.realpath(os.path.expanduser(os.environ["BB_AGENT_ROOT"]))
            if os.environ.get("BB_AGENT_ROOT")
            else None,
            nats_port=read.port("--nats-port", nats_port)
            if nats_port is not None
            else read.port("BB_NATS_PORT", os.environ.get("BB_NATS_PORT") or None),
            max_live_environments=read.count("BB_MAX_LIVE_ENVIRONMENTS", 10_000),
            max_live_environments_per_project=read.count("BB_MAX_LIVE_ENVIRONMENTS_PER_PROJECT", 1_000),
            pool_max_failures=read.count("BB_POOL_MAX_FAILURES", 3),
            port_range=(port_range := read.port_range(os.environ.get("BB_PORT_RANGE"))),
            ports_per_environment=read.ports_per_environment(port_range),
            project_roots=read.project_roots(os.environ.get("BB_PROJECT_ROOTS")),
            workspace_user=os.environ.get("BB_WORKSPACE_USER") or None,
            replica_id=read.replica_id(replica_id or os.environ.get("BB_REPLICA_ID") or host_id),
            stream_replicas=read.stream_replicas(os.environ.get("BB_STREAM_REPLICAS")),
            default_host=read.host_id(os.environ["BB_DEFAULT_HOST"], "BB_DEFAULT_HOST")
            if os.environ.get("BB_DEFAULT_HOST")
            else None,
            run_git_hooks=read.git_hooks_mode() == "run",
            max_pids_per_environment=read.at_least(
                "BB_MAX_PIDS_PER_ENVIRONMENT",
                MAX_PIDS_PER_ENVIRONMENT,
                MIN_PIDS_PER_ENVIRONMENT,
                "a number of processes",
            ),
            max_memory_per_environment=read.at_least(
                "BB_MAX_MEMORY_PER_ENVIRONMENT",
                MAX_MEMORY_PER_ENVIRONMENT,
                MIN_MEMORY_PER_ENVIRONMENT,
                "a number of bytes",
            ),
            saved_work_max_bytes=read.saved_work_max_bytes(),
            disk_scan_interval_s=read.positive("BB_DISK_SCAN_INTERVAL_S", 600, "a number of seconds"),
            max_disk_bytes_per_project=read.optional_count("BB_MAX_DISK_BYTES_PER_PROJECT"),
        )

    @property
    def data_dir(self) -> "Path":
        from pathlib import Path

        return Path(self.data_root)

    @property
    def workspaces_root(self) -> "Path":
        """Where the providers of the agent in `bb serve` keep what they own."""
        from pathlib import Path

        return Path(self.agent_root) if self.agent_root else self.data_dir

    @property
    def server_file(self) -> str:
        return os.path.join(self.data_root, SERVER_FILE)


def nats_credentials(url: str | None = None) -> "ConnectOptions":
    """nats-py connect options for an external NATS, from the environment only, so that credentials
    never appear in argv or logs; a `tls://` URL also gets a TLS context (CA from BB_NATS_CA)."""
    from urllib.parse import urlparse  # here, as pathlib is (see above): the CLI needs it for an external NATS only

    options: ConnectOptions = {}
    if url is not None and urlparse(url).scheme == "tls":
        import ssl  # here: `bb` loads it only for such a URL (a tenth of its imports otherwise)

        options["tls"] = ssl.create_default_context(cafile=os.environ.get("BB_NATS_CA") or None)
    if creds := os.environ.get("BB_NATS_CREDS"):
        return {**options, "user_credentials": creds}
    if nkey := os.environ.get("BB_NATS_NKEY"):
        return {**options, "nkeys_seed": nkey}
    if token := os.environ.get("BB_NATS_TOKEN"):
        return {**options, "token": token}
    if user := os.environ.get("BB_NATS_USER"):
        return {**options, "user": user, "password": os.environ.get("BB_NATS_PASSWORD", "")}
    return options


def url_without_credentials(url: str) -> str:
    """What may be written down (server.json, logs): credentials stay in the environment."""
    from urllib.parse import urlparse

    def bare(server: str) -> str:
        parts = urlparse(server)
        return parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")).geturl()

    return ",".join(bare(server) for server in nats_servers(url))


def hook_record_sync() -> "SyncLevel":
    """BB_HOOK_RECORD_SYNC: how the hook records survive the machine going down (hooks/records.py)."""
    # Imported only here, like the event store's module: no `bb` command but serve runs hooks.
    from bb_environments.hooks import records

    return sync_level("BB_HOOK_RECORD_SYNC", records.SYNC_LEVELS)


def hook_output_max_bytes() -> int:
    """BB_HOOK_OUTPUT_MAX_BYTES: how much of a hook's output its log keeps (hooks/output_log.py)."""
    from bb_environments.hooks import output_log  # as above: only what runs hooks needs it

    raw = os.environ.get("BB_HOOK_OUTPUT_MAX_BYTES")
    if not raw:
        return output_log.DEFAULT_OUTPUT_MAX_BYTES
    if raw.isascii() and raw.isdigit() and int(raw) >= output_log.MIN_OUTPUT_MAX_BYTES:
        return int(raw)
    raise ConfigError(
        f"BB_HOOK_OUTPUT_MAX_BYTES {raw!r} is not allowed: use a number of bytes, at least "
        f"{output_log.MIN_OUTPUT_MAX_BYTES}"
    )


def hook_limits(settings: Settings) -> "Limits":
    """What each environment's hooks may use together (BB_MAX_PIDS_PER_ENVIRONMENT, BB_MAX_MEMORY_PER_ENVIRONMENT)."""
    from bb_environments.providers.host.containment import Limits  # as above: only what runs hooks needs it

    return Limits(settings.max_pids_per_environment, settings.max_memory_per_environment)


def run_hooks_as(settings: Settings) -> "WorkspaceUser | None":
    """BB_WORKSPACE_USER as the user it names, checked: one that exists, is not root, and that
    this process may run as (it changes users, so it runs as root)."""
    if settings.workspace_user is None:
        return None
    from bb_environments.providers.host.workspace_user import WorkspaceUser

    try:
        user = WorkspaceUser.named(settings.workspace_user)
    except ValueError as bad:
        raise ConfigError(str(bad)) from None
    if os.geteuid() != 0:
        raise ConfigError(
            f"BB_WORKSPACE_USER {settings.workspace_user!r} needs the agent to run as root, "
            "which alone may start hooks as another user"
        )
    return user


Level = TypeVar("Level", bound=str)


def sync_level(variable: str, levels: tuple[Level, ...]) -> Level:
    """`normal` (the default: safe after a kill -9, not after a power loss) or `full`."""
    level = (os.environ.get(variable) or "normal").strip().lower()
    for allowed in levels:
        if level == allowed:
            return allowed
    raise ConfigError(f"{variable} {level!r} is not allowed: use {' or '.join(levels)}")


def event_store_file(url: str) -> "Path | None":
    """The SQLite event store's file, symlinks resolved, so that every alias of it names one file;
    None for PostgreSQL."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    return Path(unquote(parsed.path)).resolve() if parsed.scheme == "sqlite" else None


class Holder(msgspec.Struct, rename="camel"):
    """Who holds one of the service's locks: a data dir's, or an event store's writer lock."""

    pid: int
    data_dir: str


def serving(data_dir: "Path") -> Holder | None:
    """The `bb serve` holding `data_dir`, as its lock recorded it, while that pid lives."""
    # Imported here: `bb` asks only when server.json is unusable.
    from bb_environments.providers.host.file_lock import read_holder
    from bb_environments.providers.host.processes import pid_alive

    holder = read_holder(data_dir / SERVE_LOCK, Holder)
    return holder if holder is not None and pid_alive(holder.pid) else None


class ServerFile:
    """server.json as the running service keeps it: written at start, again when what it says
    changes (a restarted nats-server), and whenever it goes missing or someone else changes it,
    since no client can reach the service without it."""

    def __init__(self, path: "Path", info: ServerInfo) -> None:
        self.path, self.info = path, info
        self._written = b""

    def write(self) -> None:
        self._written = msgspec.json.format(msgspec.json.encode(self.info), indent=2)
        write_durably(self.path, self._written)

    def update(self, **changes: Any) -> None:
        self.info = msgspec.structs.replace(self.info, **changes)
        try:
            self.write()
        except OSError as failed:  # not a reason to stop serving: `keep` tries again
            _log().warning("%s could not be written: %s", self.path, failed.strerror)

    async def keep(self, interval: float) -> None:
        import asyncio  # `bb serve` only: no other command loads it for this module

        unwritable = None
        while True:
            await asyncio.sleep(interval)
            try:
                if self.path.read_bytes() == self._written:
                    continue
                problem = "was changed"
            except FileNotFoundError:
                problem = "was missing"
            except OSError as unreadable:
                problem = f"could not be read ({unreadable.strerror})"
            try:
                self.write()
            except OSError as failed:
                if failed.strerror != unwritable:  # said once, not at every check
                    _log().warning("%s %s and cannot be written again: %s", self.path, problem, failed.strerror)
                unwritable = failed.strerror
                continue
            unwritable = None
            _log().warning("%s %s; wrote it again", self.path, problem)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _log() -> "logging.Logger":
    # Only `bb serve` keeps server.json and logs: every other command goes without the module.
    import logging

    return logging.getLogger(__name__)
