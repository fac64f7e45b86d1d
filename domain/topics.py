"""The topics under which the log stores events: today's module names, and those of logs written
before the package was named bb_environments, which call their events `domain.<module>:<class>`.

Apart from the package's __init__: registering the old names loads the event library, which the
`bb` commands that only import `domain.status` go without."""

from eventsourcing.utils import register_topic, resolve_topic

import bb_environments.domain

LEGACY_PACKAGE = "domain"
register_topic(LEGACY_PACKAGE, bb_environments.domain)


def topic_prefixes(aggregate: type) -> tuple[str, ...]:
    """The prefixes of an aggregate's event topics in the log: today's and the one before the rename."""
    legacy = LEGACY_PACKAGE + aggregate.__module__.removeprefix(bb_environments.domain.__name__)
    return tuple(f"{module}:{aggregate.__qualname__}." for module in (aggregate.__module__, legacy))


def event_class(topic: str) -> type:
    """The class a stored event's topic names, under either name of its module."""
    found: type = resolve_topic(topic)
    return found
