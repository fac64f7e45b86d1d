"""Every NATS subject, stream and consumer name the service uses, in one place.

Inbound thread events arrive on `bb.threads.<threadId>.<event>` (stream BB_THREADS). Stream
BB_THREAD_PARTITIONS mirrors it, storing each event under `bb.ingress.<partition>.<threadId>.<event>`:
the partition is a hash of the thread id, so one thread's events stay in one partition, in order.
The outbox relay stores every event of the log under `bb.log.<aggregate>.<id>.<event>` (stream
BB_ENVIRONMENTS); the stream re-publishes environment events once each, after they are stored, to
`bb.environments.<environmentId>.<event>` for plain subscribers. Each thread's placement outcome is
published on `bb.placements.<threadId>.<status>` (stream BB_PLACEMENTS). A host's agent writes its
transcript lines under its own host, `bb.hosts.<hostId>.transcripts.<environmentId>` (stream
BB_TRANSCRIPT_INTAKE); the core keeps those of the host's own environments on
`bb.transcripts.<environmentId>` (stream BB_TRANSCRIPTS), where subscribers read them.
"""

from collections.abc import Mapping

THREADS_STREAM = "BB_THREADS"
THREAD_EVENTS = "bb.threads.>"

THREAD_PARTITIONS_STREAM = "BB_THREAD_PARTITIONS"
# Each partition has one in-order consumer; the count is fixed, since changing it would move a
# thread to another partition (and consumer) while its earlier events may still wait in the old one.
THREAD_PARTITIONS = 16
_INGRESS = "bb.ingress"

ENVIRONMENTS_STREAM = "BB_ENVIRONMENTS"
LOG_EVENTS = "bb.log.>"
LOG_ENVIRONMENT_EVENTS = "bb.log.environment.>"
ENVIRONMENT_EVENTS = "bb.environments.>"
NOTIFICATION_HEADER = "Bb-Notification-Id"
"""The header that names the log position (notification id) a log stream message carries."""

PLACEMENTS_STREAM = "BB_PLACEMENTS"
PLACEMENT_EVENTS = "bb.placements.>"

TRANSCRIPTS_STREAM = "BB_TRANSCRIPTS"
TRANSCRIPT_EVENTS = "bb.transcripts.>"
# What the hosts' agents write, each under its own host: only the core, which checks each line's
# environment against the log, moves a line on to the transcripts everyone reads.
TRANSCRIPT_INTAKE_STREAM = "BB_TRANSCRIPT_INTAKE"
HOST_TRANSCRIPTS = "bb.hosts.*.transcripts.*"

# The service's durable consumers: the log's (read models, then the provisioner) and the transcripts'.
LOG_CONSUMER = "projections"
TRANSCRIPTS_CONSUMER = "transcripts"
TRANSCRIPT_INTAKE_CONSUMER = "transcript-intake"
# Consumers an earlier service's layout had: a start hands over from them, then deletes them.
RETIRED_THREADS_CONSUMER = "threads"
RETIRED_PROVISIONER_CONSUMER = "provisioner"

API_SERVICE = "bb-environments"
API_PREFIX = "bb.api"

HOST_AGENT_SERVICE = "bb-host-agent"

# The work a host's agent must do survives its absence: the core queues each job under the host's
# own subjects, and only that host's consumer (and NATS user) takes it. Its report is kept, the
# newest per operation, for a core that was away when it came.
HOST_JOBS_STREAM = "BB_HOST_JOBS"
HOST_JOBS = "bb.hosts.*.jobs.>"
HOST_REPORTS_STREAM = "BB_HOST_REPORTS"
HOST_REPORTS = "bb.hosts.*.reports.>"
HOST_LEDGER_REQUESTS = "bb.hosts.*.ledger"
# A hook's secrets (SPEC 11), asked by the agent about to run it: answered on the agent's own inbox,
# which no client may read, and never stored in a stream (the host jobs' stream keeps no value).
HOST_SECRETS_REQUESTS = "bb.hosts.*.secrets"
# Each agent's heartbeat, the newest per host: `bb machine list` and the waiting steps read it.
HOSTS_BUCKET = "BB_HOSTS"

# Core replicas sharing one store (SPEC 7.2): each one's presence, which refuses a second with its
# id; and the leases that say which replica relays the log and which drives each partition of the
# environments. A key of either lives only as long as its holder keeps writing it (the bucket's TTL).
REPLICAS_BUCKET = "BB_REPLICAS"
LEASES_BUCKET = "BB_LEASES"
RELAY_LEASE = "relay"
# One replica at a time moves the hosts' transcript lines on, so that they keep their order.
TRANSCRIPT_INTAKE_LEASE = "transcript-intake"
# Fixed, like the thread partitions: an environment's partition must not move while it is driven.
DRIVE_PARTITIONS = 16
# A replica that saved says so here, so that the one relaying reads the log at once instead of at
# its next poll.
LOG_GREW = "bb.replicas.log-grew"
# A thread's message on an environment that another replica drives: told to that replica, whose
# idle pause and resume count it.
ACTIVITY = "bb.replicas.activity"
# A project's secret values (SPEC 11), which each replica keeps in its own data dir: a set or
# removal told to every other replica, or a replica's request for the values it lacks. Read by the
# core's service user only; the answers go to its service inbox.
REPLICA_SECRETS_REQUESTS = "bb.replicas.*.secrets"


def thread_event(thread_id: str, kind: str) -> str:
    return f"bb.threads.{thread_id}.{kind}"


def thread_partition(partition: int) -> str:
    """The subjects of one partition in stream BB_THREAD_PARTITIONS."""
    return f"{_INGRESS}.{partition}.>"


def thread_partition_consumer(partition: int) -> str:
    return f"threads-{partition}"


def thread_partition_transforms() -> list[tuple[str, str]]:
    """How the mirror maps thread subjects to partitions: the server hashes the thread id token.
    A subject with no event token is mapped too, so that it is refused in the log, not dropped."""
    partition = f"{{{{partition({THREAD_PARTITIONS},1)}}}}"
    return [
        ("bb.threads.*.>", f"{_INGRESS}.{partition}.{{{{wildcard(1)}}}}.>"),
        ("bb.threads.*", f"{_INGRESS}.{partition}.{{{{wildcard(1)}}}}"),
    ]


def published_subject(partitioned: str) -> str:
    """The subject a thread event was published on, from the one its partition stores it under."""
    _, _, _, rest = partitioned.split(".", 3)
    return f"bb.threads.{rest}"


def log_event(aggregate: str, aggregate_id: str, event: str) -> str:
    return f"bb.log.{aggregate}.{aggregate_id}.{event}"


def environment_event(environment_id: str, event: str = "*") -> str:
    return f"bb.environments.{environment_id}.{event}"


def placement(thread_id: str, status: str) -> str:
    return f"bb.placements.{thread_id}.{status}"


def transcript(environment_id: str) -> str:
    return f"bb.transcripts.{environment_id}"


def host_transcript(host_id: str, environment_id: str) -> str:
    """Where the agent of `host_id` writes a line of one of its environments' transcripts."""
    return f"bb.hosts.{host_id}.transcripts.{environment_id}"


def host_transcripts(host_id: str) -> str:
    return f"bb.hosts.{host_id}.transcripts.*"


def api(area: str, verb: str) -> str:
    return f"{API_PREFIX}.{area}.{verb}"


def host_hooks(host_id: str, verb: str) -> str:
    """The host agent's hook API: `bb.hosts.<hostId>.hooks.<start|status|cancel>`."""
    return f"bb.hosts.{host_id}.hooks.{verb}"


def host_job(host_id: str, operation_id: str) -> str:
    return f"bb.hosts.{host_id}.jobs.{_token(operation_id)}"


def host_jobs(host_id: str) -> str:
    return f"bb.hosts.{host_id}.jobs.>"


def host_jobs_consumer(host_id: str) -> str:
    return f"host-{host_id}"


def host_report(host_id: str, operation_id: str) -> str:
    return f"bb.hosts.{host_id}.reports.{_token(operation_id)}"


def host_reports(host_id: str) -> str:
    return f"bb.hosts.{host_id}.reports.>"


def host_ledger(host_id: str) -> str:
    """Where a host's agent asks the core what the log recorded for one of its operations."""
    return f"bb.hosts.{host_id}.ledger"


def replica_secrets(replica_id: str) -> str:
    """Where a replica is told another's secret values, or asked for its own."""
    return f"bb.replicas.{replica_id}.secrets"


def host_secrets(host_id: str) -> str:
    """Where a host's agent asks the core for the secrets of a hook it is about to run."""
    return f"bb.hosts.{host_id}.secrets"


def host_workspaces(host_id: str, verb: str) -> str:
    """The host agent's read-only questions about its workspaces (plan, providers, survey, ...)."""
    return f"bb.hosts.{host_id}.workspaces.{verb}"


def host_of(subject: str) -> str:
    """The host a `bb.hosts.<hostId>...` subject names."""
    return subject.split(".", 3)[2]


def transcript_environment_of(subject: str) -> str:
    """The environment a `bb.hosts.<hostId>.transcripts.<environmentId>` subject names."""
    return subject.rpartition(".")[2]


def drive_lease(partition: int) -> str:
    return f"drive-{partition}"


def _token(operation_id: str) -> str:
    # Operation ids contain dots; a digest keeps them one subject token. Imported here: hashlib
    # loads OpenSSL, which no `bb` command but serve needs.
    import hashlib

    return hashlib.sha256(operation_id.encode()).hexdigest()[:32]


def claimed_notification_id(headers: Mapping[str, str] | None) -> int | None:
    """The notification id a log stream message says it carries, if it says one."""
    try:
        claimed = int((headers or {}).get(NOTIFICATION_HEADER, ""))
    except ValueError:
        return None
    return claimed if claimed > 0 else None
