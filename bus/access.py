"""Who may do what on the bus (SPEC section 6): one NKEY user per role and the permissions of each.

The embedded nats-server enforces these sets through the configuration rendered here; for an
external NATS the same sets are what docs/security.md tells a deployment to configure. Clients
(`operator`, `publisher`, `subscriber`) never publish where the service keeps its truth: the
stored log subjects, `bb.environments.>`, `bb.transcripts.>` and `bb.hosts.>` are the service's,
and nobody else may touch the streams or the service's own consumers.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

import msgspec

from bb_environments.bus.wire import subjects
from bb_environments.domain.ids import HOST_ID_PATTERN, HOST_ID_RULE, quoted
from bb_environments.providers.host.durable_files import write_durably

if TYPE_CHECKING:  # every `bb` command loads this module, and none that only sends requests needs pathlib
    from pathlib import Path

CLIENT_ROLES = ("operator", "publisher", "subscriber")
SERVICE_USER = "service"
# The reply subjects of the internal connections: answers to their requests (JetStream API, publish
# acks, hook requests) and what the service's pull consumers deliver, prompts included. Under
# nats-py's default `_INBOX`, which every client role may read for its own replies, any client would
# read all of that; no client permission matches these (their first token is not `_INBOX`).
SERVICE_INBOX_PREFIX = "_BB_SERVICE_INBOX"

# The consumers the service reads the streams with: a client that could pull from or delete one
# of them could hide events from the read model or the provisioning driver. The retired ones are
# included: a start still hands over from them, so no client may hold those names.
SERVICE_CONSUMERS = (
    subjects.LOG_CONSUMER,
    subjects.RETIRED_PROVISIONER_CONSUMER,
    subjects.TRANSCRIPTS_CONSUMER,
    subjects.RETIRED_THREADS_CONSUMER,
)
# The streams clients may read, each with the part of it that is theirs: BB_ENVIRONMENTS stores the
# whole log, and its threads' and claims' events are the service's.
READABLE_STREAMS = {
    subjects.ENVIRONMENTS_STREAM: subjects.LOG_ENVIRONMENT_EVENTS,
    subjects.TRANSCRIPTS_STREAM: subjects.TRANSCRIPT_EVENTS,
    subjects.PLACEMENTS_STREAM: subjects.PLACEMENT_EVENTS,
}
# The API's requests that change nothing: every client role may ask them; only `operator` may
# ask the rest (spawn, retry, delete, ...).
READ_ONLY_API = (
    subjects.api("environments", "list"),
    subjects.api("environments", "show"),
    subjects.api("environments", "providers"),
    subjects.api("threads", "list"),
    subjects.api("pools", "list"),
)

_HOST_ID = re.compile(HOST_ID_PATTERN)


class Permissions(msgspec.Struct, omit_defaults=True):
    publish: dict[str, list[str]]
    subscribe: dict[str, list[str]]
    allow_responses: bool = False


def host_agent_user(host_id: str) -> str:
    return f"host-{host_id}"


def host_agent_inbox_prefix(host_id: str) -> str:
    """The replies to a host agent's own requests (its jobs, its reports' acks, the ledger's
    answers): its user reads these and no other inbox, and no client reads these."""
    return f"_BB_HOST_INBOX.{host_id}"


def check_host_id(host_id: str) -> str:
    """A host id is one subject token and part of a file name."""
    if not _HOST_ID.match(host_id):
        raise ValueError(f"host id {quoted(host_id)} is not allowed: use {HOST_ID_RULE}")
    return host_id


def _consumers_of_readable_streams() -> list[str]:
    """Creating, reading and deleting one's own consumers on the streams clients may read.

    A consumer is created only by the subject that names it and its filter, as nats-py's
    `pull_subscribe` does: the server holds the request's body to both, so no client takes a
    service consumer's name through the body (the subject's name is denied) or filters its way
    past its part of the stream. What the body may still say, a push consumer's delivery subject,
    reaches no endpoint of ours: see bus/micro_requests.py.
    """
    allowed = ["$JS.API.INFO", "$JS.API.STREAM.NAMES"]
    for stream, readable in READABLE_STREAMS.items():
        allowed += [
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.*.{readable}",
            f"$JS.API.CONSUMER.INFO.{stream}.*",
            f"$JS.API.CONSUMER.DELETE.{stream}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.API.CONSUMER.LIST.{stream}",
            f"$JS.API.CONSUMER.NAMES.{stream}",
        ]
    return allowed


def _service_consumers_denied() -> list[str]:
    denied = []
    for name in SERVICE_CONSUMERS:
        denied += [
            f"$JS.API.CONSUMER.*.*.{name}",
            f"$JS.API.CONSUMER.*.*.{name}.>",
            f"$JS.API.CONSUMER.*.*.*.{name}",
            f"$JS.ACK.*.{name}.>",
        ]
    return denied


def _reader() -> Permissions:
    """What every client role may do: read the environment events, transcripts and placement
    outcomes (with consumers of its own on their streams) and ask the read-only API."""
    return Permissions(
        publish={"allow": [*READ_ONLY_API, *_consumers_of_readable_streams()], "deny": _service_consumers_denied()},
        subscribe={
            "allow": [subjects.ENVIRONMENT_EVENTS, subjects.TRANSCRIPT_EVENTS, subjects.PLACEMENT_EVENTS, "_INBOX.>"]
        },
        allow_responses=True,  # acks and flow-control replies to the messages it was sent
    )


def role_permissions(role: str) -> Permissions:
    """The permission set of a client role, exactly as SPEC sections 6 and 8.1 list it."""
    reader = _reader()
    if role == "subscriber":
        return reader
    if role == "operator":
        # `bb events export` reads the whole log, as `bb events replay` has the service do.
        whole_log = f"$JS.API.CONSUMER.CREATE.{subjects.ENVIRONMENTS_STREAM}.*.{subjects.LOG_EVENTS}"
        return Permissions(
            publish={
                **reader.publish,
                "allow": [f"{subjects.API_PREFIX}.>", whole_log, *_consumers_of_readable_streams()],
            },
            subscribe=reader.subscribe,
            allow_responses=True,
        )
    if role == "publisher":
        return Permissions(
            publish={**reader.publish, "allow": [subjects.THREAD_EVENTS, *reader.publish["allow"]]},
            subscribe=reader.subscribe,
            allow_responses=True,
        )
    raise ValueError(f"unknown role {role!r}: the roles are {', '.join(CLIENT_ROLES)}")


def host_agent_permissions(host_id: str) -> Permissions:
    """A host agent takes its own host's jobs and reports them, answers its own host's requests,
    asks the core about its own operations, beats its own heart and writes its own host's
    transcript lines, which the core checks before anyone reads them; nothing more: no thread
    events, no log, no transcripts, no API, no other host's subjects or consumer."""
    jobs, consumer = subjects.HOST_JOBS_STREAM, subjects.host_jobs_consumer(host_id)
    return Permissions(
        publish={
            "allow": [
                f"$JS.API.CONSUMER.MSG.NEXT.{jobs}.{consumer}",
                f"$JS.ACK.{jobs}.{consumer}.>",
                subjects.host_reports(host_id),
                subjects.host_ledger(host_id),
                subjects.host_secrets(host_id),
                f"$KV.{subjects.HOSTS_BUCKET}.{host_id}",
                subjects.host_transcripts(host_id),
            ]
        },
        subscribe={
            "allow": [
                subjects.host_hooks(host_id, "*"),
                subjects.host_workspaces(host_id, "*"),
                "$SRV.>",
                f"{host_agent_inbox_prefix(host_id)}.>",
            ]
        },
        allow_responses=True,
    )


# Never the clients' inboxes: a service connection that took nats-py's default inbox prefix would
# have every request of it refused, instead of its replies and deliveries reaching clients.
SERVICE_PERMISSIONS = Permissions(publish={"allow": [">"]}, subscribe={"allow": [">"], "deny": ["_INBOX.>"]})


class DamagedSeed(ValueError):
    pass


class Credentials:
    """The seed files of every user, under `<data dir>/credentials`, each readable by its owner only.

    nkeys is imported where a seed is made or read: every `bb` command loads this module (for the
    host id's rule), and only `bb serve` does either (the CLI signs with bus/api_client/nkey_signer.py)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def seed_file(self, user: str) -> Path:
        return self.directory / f"{user}.nk"

    def ensure(self, users: list[str]) -> None:
        """Create the seeds that do not exist yet; existing ones are kept, so clients keep working."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for user in users:
            path = self.seed_file(user)
            if not path.exists():
                write_durably(path, new_seed().encode())

    def public_key(self, user: str) -> str:
        return _public_key_of(self.seed_file(user), f"role {user!r}")

    def host_seed_file(self, host_id: str) -> Path:
        """The seed of a registered host's agent (`bb machine register`)."""
        return self.directory / "hosts" / f"{check_host_id(host_id)}.nk"

    def registered_hosts(self) -> list[str]:
        """The hosts whose agent's seed is kept here: the ones this data dir registered (which hosts
        are registered is the event log's, handlers/host_registry.py)."""
        hosts = self.directory / "hosts"
        found = sorted(seed.stem for seed in hosts.glob("*.nk")) if hosts.is_dir() else []
        return [host_id for host_id in found if _HOST_ID.match(host_id)]

    def register_host(self, host_id: str, seed: str) -> Path:
        """Keep `seed` as the host's agent's, replacing any it had: the old one stops working at the
        server's next reload."""
        path = self.host_seed_file(host_id)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_durably(path, seed.encode())
        return path

    def forget_host(self, host_id: str) -> None:
        self.host_seed_file(host_id).unlink(missing_ok=True)

    def host_public_key(self, host_id: str) -> str:
        return _public_key_of(self.host_seed_file(host_id), f"host {host_id!r}")

    def client_files(self) -> dict[str, str]:
        """What server.json names under `credentials`: the clients' seed files, never the seeds."""
        return {role: str(self.seed_file(role)) for role in CLIENT_ROLES}


def server_configuration(credentials: Credentials, host_id: str, server_name: str) -> str:
    """The nats-server configuration (JSON is valid nats-server syntax) that admits only our users:
    the clients, the service, the agent of its own host and the agent of each registered host.

    It names the server as its command line does: a running server reads the file again on
    SIGHUP and refuses one that leaves out a name it was started with."""
    users = [(user, credentials.public_key(user), permissions) for user, permissions in _own_users(host_id)]
    users += [
        (host_agent_user(registered), credentials.host_public_key(registered), host_agent_permissions(registered))
        for registered in credentials.registered_hosts()
        if registered != host_id
    ]
    return json.dumps({"server_name": server_name, **_authorization(users)}, indent=2)


def deployment_configuration(host_id: str = "HOST_ID") -> str:
    """The same block for an external NATS, with a placeholder for each user's public key (docs/security.md)."""
    users = [(user, f"<public NKEY of {user}>", permissions) for user, permissions in _own_users(host_id)]
    return json.dumps(_authorization(users), indent=2)


def host_user_block(host_id: str, public_key: str) -> str:
    """The entry an external NATS adds to its users for a registered host's agent."""
    return json.dumps(
        _authorization([(host_agent_user(host_id), public_key, host_agent_permissions(host_id))]), indent=2
    )


def _own_users(host_id: str) -> list[tuple[str, Permissions]]:
    users = [(role, role_permissions(role)) for role in CLIENT_ROLES]
    return users + [(SERVICE_USER, SERVICE_PERMISSIONS), (host_agent_user(host_id), host_agent_permissions(host_id))]


def _authorization(users: list[tuple[str, str, Permissions]]) -> dict[str, Any]:
    entries = [
        {"nkey": public_key, "permissions": msgspec.to_builtins(permissions)} for _, public_key, permissions in users
    ]
    return {"authorization": {"users": entries}}


def new_seed() -> str:
    """A new NKEY seed of a user (see Credentials for why nkeys is imported here)."""
    import nkeys

    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode()


def seed_public_key(seed: str) -> str:
    """The public key of a user's seed: what a NATS server admits it by."""
    import nkeys

    public_key: bytes = nkeys.from_seed(bytearray(seed.strip().encode())).public_key
    return public_key.decode()


def _public_key_of(path: Path, whose: str) -> str:
    import nkeys

    try:
        return seed_public_key(path.read_text())
    except (nkeys.NkeysError, ValueError):
        raise DamagedSeed(
            f"{path} holds no valid seed; delete it and start `bb serve` again to make a new "
            f"one (a client of {whose} then needs to read the new file)"
        ) from None


def all_users(host_id: str) -> list[str]:
    return [*CLIENT_ROLES, SERVICE_USER, host_agent_user(host_id)]
