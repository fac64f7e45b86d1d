"""The domain: aggregates, their events and rules, the application service; no I/O."""

import sys

from eventsourcing.utils import register_topic

# Logs written before the package was named bb_environments call their events `domain.<module>:<class>`.
LEGACY_PACKAGE = "domain"
register_topic(LEGACY_PACKAGE, sys.modules[__name__])


def topic_prefixes(aggregate: type) -> tuple[str, ...]:
    """The prefixes of an aggregate's event topics in the log: today's and the one before the rename."""
    legacy = LEGACY_PACKAGE + aggregate.__module__.removeprefix(__name__)
    return tuple(f"{module}:{aggregate.__qualname__}." for module in (aggregate.__module__, legacy))
