"""Every NATS subject and stream the service uses, in one place.

Inbound thread events arrive on `bb.threads.<threadId>.<event>` (stream BB_THREADS).
The outbox relay stores every event of the log under `bb.log.<aggregate>.<id>.<event>` (stream
BB_ENVIRONMENTS); the stream re-publishes environment events once each, after they are stored, to
`bb.environments.<environmentId>.<event>` for plain subscribers.
"""

import hashlib

THREADS_STREAM = "BB_THREADS"
THREAD_EVENTS = "bb.threads.>"

ENVIRONMENTS_STREAM = "BB_ENVIRONMENTS"
LOG_EVENTS = "bb.log.>"
LOG_ENVIRONMENT_EVENTS = "bb.log.environment.>"
ENVIRONMENT_EVENTS = "bb.environments.>"

TRANSCRIPTS_STREAM = "BB_TRANSCRIPTS"
TRANSCRIPT_EVENTS = "bb.transcripts.>"

API_SERVICE = "bb-environments"
API_PREFIX = "bb.api"

HOST_AGENT_SERVICE = "bb-host-agent"


def thread_event(thread_id: str, kind: str) -> str:
    return f"bb.threads.{thread_id}.{kind}"


def log_event(aggregate: str, aggregate_id: str, event: str) -> str:
    return f"bb.log.{aggregate}.{aggregate_id}.{event}"


def environment_event(environment_id: str, event: str = "*") -> str:
    return f"bb.environments.{environment_id}.{event}"


def transcript(environment_id: str) -> str:
    return f"bb.transcripts.{environment_id}"


def api(area: str, verb: str) -> str:
    return f"{API_PREFIX}.{area}.{verb}"


def host_hooks(host_id: str, verb: str) -> str:
    """The host agent's hook API: `bb.hosts.<hostId>.hooks.<start|status|cancel>`."""
    return f"bb.hosts.{host_id}.hooks.{verb}"


def hook_finished(host_id: str, operation_id: str) -> str:
    # Operation ids contain dots; a digest keeps them one subject token.
    token = hashlib.sha256(operation_id.encode()).hexdigest()[:32]
    return f"bb.hosts.{host_id}.hooks.finished.{token}"
