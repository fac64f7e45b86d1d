"""What the service withholds from the repository's code it runs (hooks, and git with its hooks),
and what it gives a hook on purpose.

Standard library only: the hook supervisor, which runs without site-packages, imports this.
"""

from __future__ import annotations

from collections.abc import Mapping

# The service's own settings and credentials: a hook is the repository's code, run by whoever can
# write to it. Its own (BB_NATS_PASSWORD, BB_EVENT_STORE with a database's password, ...), those of
# the NATS command line (NATS_CREDS, NATS_NKEY), of Modal's client (MODAL_TOKEN_SECRET), of libpq
# (PGPASSWORD), and the eventsourcing library's, which reads its settings from the environment
# too, bare or prefixed with its application's name (POSTGRES_PASSWORD, ENVIRONMENTS_POSTGRES_*,
# CIPHER_KEY, SQLITE_DBNAME, PERSISTENCE_MODULE).
WITHHELD_ENV_PREFIXES = (
    "BB_",
    "NATS_",
    "MODAL_",
    "PG",
    "POSTGRES_",
    "ENVIRONMENTS_",
    "CIPHER_",
    "SQLITE_",
    "PERSISTENCE_",
)


def without_secrets(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` without what the service withholds from hooks (and from whatever runs them)."""
    return {name: value for name, value in environment.items() if not name.startswith(WITHHELD_ENV_PREFIXES)}


def hook_environment(service_environment: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """What a hook runs with: the service's environment without its settings and credentials, and
    the variables the core gives the hook on purpose (`given`, see RecordedHook.given_variables),
    which may have a withheld prefix (BB_ENVIRONMENT_ID) since they are the hook's own."""
    return without_secrets(service_environment) | dict(given)
