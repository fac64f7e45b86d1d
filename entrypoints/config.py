"""Settings (flag beats environment variable beats default) and the running service's server.json."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "bb"
SERVER_FILE = "server.json"
THREADS_MAX_AGE_S = 7 * 24 * 3600
THREADS_MAX_BYTES = 1 << 30


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    data_dir: Path
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

    @classmethod
    def load(cls, data_dir: str | None = None, nats_url: str | None = None) -> Settings:
        root = Path(data_dir or os.environ.get("BB_DATA_DIR") or DEFAULT_DATA_DIR).expanduser().resolve()
        return cls(
            data_dir=root,
            nats_url=nats_url or os.environ.get("BB_NATS_URL") or None,
            event_store=os.environ.get("BB_EVENT_STORE") or f"sqlite:///{root / 'events.sqlite'}",
            host_id=os.environ.get("BB_HOST_ID", "local"),
            retire_grace_override=_grace_override(os.environ.get("BB_RETIRE_GRACE_MS")),
            hook_timeout_s=_number("BB_HOOK_TIMEOUT_S", 900),
            sweep_interval_s=_number("BB_SWEEP_INTERVAL_S", 30),
            transient_retry_s=_number("BB_TRANSIENT_RETRY_S", 30),
            extra_providers=tuple(p for p in os.environ.get("BB_EXTRA_PROVIDERS", "").split(",") if p),
            threads_max_age_s=_positive("BB_THREADS_MAX_AGE_S", THREADS_MAX_AGE_S, "a number of seconds"),
            threads_max_bytes=int(_positive("BB_THREADS_MAX_BYTES", THREADS_MAX_BYTES, "a number of bytes")),
        )

    @property
    def server_file(self) -> Path:
        return self.data_dir / SERVER_FILE


def nats_credentials() -> dict[str, Any]:
    """Credentials come from the environment only, so they never appear in argv or logs."""
    if creds := os.environ.get("BB_NATS_CREDS"):
        return {"user_credentials": creds}
    if token := os.environ.get("BB_NATS_TOKEN"):
        return {"token": token}
    if user := os.environ.get("BB_NATS_USER"):
        return {"user": user, "password": os.environ.get("BB_NATS_PASSWORD", "")}
    return {}


def url_without_credentials(url: str) -> str:
    """What may be written down (server.json, logs): credentials stay in the environment."""
    parts = urlparse(url)
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()


def event_store_environment(url: str) -> dict[str, str]:
    """The eventsourcing library's settings for `sqlite:///path` or `postgresql://...`."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = Path(unquote(parsed.path))
        path.parent.mkdir(parents=True, exist_ok=True)
        return {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": parsed.path.lstrip("/"),
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or ""),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
        }
    raise ConfigError(f"BB_EVENT_STORE {parsed.scheme!r} is not supported: use sqlite:///path or postgresql://...")


def _grace_override(raw: str | None) -> tuple[int | None] | None:
    if raw is None or raw == "":
        return None
    if raw.lower() in ("null", "never"):
        return (None,)
    try:
        return (int(raw),)
    except ValueError:
        raise ConfigError(f"BB_RETIRE_GRACE_MS must be milliseconds or 'null' (never), got {raw!r}") from None


def _number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None


def _positive(name: str, default: float, what: str) -> float:
    """A finite limit: zero or less would mean none to JetStream."""
    raw = os.environ.get(name)
    try:
        value = float(raw) if raw else default
        if 0 < value < float("inf"):
            return value
    except ValueError:
        pass
    raise ConfigError(f"{name} must be {what} greater than 0, got {raw!r}")


def read_server_file(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_server_file(path: Path, content: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(content, indent=2))
    os.replace(temporary, path)
