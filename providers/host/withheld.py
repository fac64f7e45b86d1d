"""What the service withholds from the repository's code it runs: hooks, and git with its hooks.

Standard library only: the hook supervisor, which runs without site-packages, imports this.
"""

from __future__ import annotations

from collections.abc import Mapping

# The service's own settings and credentials (BB_NATS_PASSWORD, BB_NATS_NKEY, ...): a hook is the
# repository's code, run by whoever can write to it.
WITHHELD_ENV_PREFIXES = ("BB_", "NATS_", "MODAL_TOKEN_")


def without_secrets(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` without what the service withholds from hooks (and from whatever runs them)."""
    return {name: value for name, value in environment.items() if not name.startswith(WITHHELD_ENV_PREFIXES)}
