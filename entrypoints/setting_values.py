"""How each setting's text is read and checked (entrypoints/config.py reads them): a value that is
not allowed stops the service with a ConfigError naming the setting, what it got and what it takes.

No `from __future__ import annotations`, as in config.py (why is said there).
"""

import os

from bb_environments.bus.access import check_host_id


class ConfigError(ValueError):
    pass


def host_id(raw: str, setting: str = "BB_HOST_ID") -> str:
    try:
        return check_host_id(raw)
    except ValueError as bad:
        raise ConfigError(f"{setting}: {bad}") from None


def replica_id(raw: str) -> str:
    try:
        return check_host_id(raw)  # the same rule: it names KV keys and log lines
    except ValueError as bad:
        raise ConfigError(f"--replica-id (BB_REPLICA_ID): {str(bad).replace('host id', 'replica id')}") from None


def stream_replicas(raw: str | None) -> int:
    if raw is None or raw == "":
        return 1
    if not raw.isdigit() or not 1 <= int(raw) <= 5:
        raise ConfigError(
            f"BB_STREAM_REPLICAS {raw!r} is not a replica count: use 1 to 5 (JetStream's limit), 3 on a 3-node cluster"
        )
    return int(raw)


def git_hooks_mode() -> str:
    from bb_environments.providers.git_hooks import git_hooks_mode  # the providers read it there too

    try:
        return git_hooks_mode()
    except ValueError as bad:
        raise ConfigError(str(bad)) from None


def saved_work_max_bytes() -> int:
    from bb_environments.providers.host.saved_work_limit import saved_work_max_bytes  # the providers read it there too

    try:
        return saved_work_max_bytes()
    except ValueError as bad:
        raise ConfigError(str(bad)) from None


def grace_override(raw: str | None) -> tuple[int | None] | None:
    if raw is None or raw == "":
        return None
    if raw.lower() in ("null", "never"):
        return (None,)
    try:
        return (int(raw),)
    except ValueError:
        raise ConfigError(f"BB_RETIRE_GRACE_MS must be milliseconds or 'null' (never), got {raw!r}") from None


def number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None


def port(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    if raw.isascii() and raw.isdigit() and len(raw) <= 5 and 0 < int(raw) < 65536:
        return int(raw)
    raise ConfigError(f"{name} {raw!r} is not allowed: use a port number from 1 to 65535")


def count(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    if raw.isascii() and raw.isdigit() and int(raw) > 0:
        return int(raw)
    raise ConfigError(f"{name} {raw!r} is not allowed: use a whole number greater than 0")


def optional_count(name: str) -> int | None:
    """A whole number greater than 0, or None when the setting is unset (no limit)."""
    return count(name, 0) or None


def at_least(name: str, default: int, minimum: int, what: str) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    if raw.isascii() and raw.isdigit() and int(raw) >= minimum:
        return int(raw)
    raise ConfigError(f"{name} {raw!r} is not allowed: use {what}, at least {minimum}")


def port_range(raw: str | None) -> tuple[int, int]:
    if not raw:
        return 20000, 29999
    first, dash, last = (part.strip() for part in raw.partition("-"))
    if dash and all(p.isascii() and p.isdigit() and len(p) <= 5 for p in (first, last)):
        if 1024 <= int(first) <= int(last) <= 65535:
            return int(first), int(last)
    raise ConfigError(
        f"BB_PORT_RANGE {raw!r} is not allowed: use `first-last`, two port numbers from 1024 to "
        "65535, the first not above the last (default 20000-29999)"
    )


def ports_per_environment(port_range: tuple[int, int]) -> int:
    per_environment = count("BB_PORTS_PER_ENVIRONMENT", 10)
    first, last = port_range
    if per_environment > last - first + 1:
        raise ConfigError(
            f"BB_PORTS_PER_ENVIRONMENT {per_environment} is not allowed: BB_PORT_RANGE {first}-{last} holds "
            f"only {last - first + 1} ports; use a smaller number or a wider range"
        )
    return per_environment


def project_roots(raw: str | None) -> tuple[str, ...] | None:
    """Each root with its symlinks resolved, as project paths are compared once resolved."""
    if not raw:
        return None
    roots = [root for root in raw.split(":") if root]
    relative = [root for root in roots if not os.path.isabs(root)]
    if relative or not roots:
        raise ConfigError(f"BB_PROJECT_ROOTS {raw!r} is not allowed: use absolute paths separated by ':'")
    return tuple(os.path.realpath(root) for root in roots)


def positive(name: str, default: float, what: str) -> float:
    """A finite limit: zero or less would mean none to JetStream."""
    raw = os.environ.get(name)
    try:
        value = float(raw) if raw else default
        if 0 < value < float("inf"):
            return value
    except ValueError:
        pass
    raise ConfigError(f"{name} must be {what} greater than 0, got {raw!r}")
