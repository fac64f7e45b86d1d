"""The core's store of the projects' secret values (SPEC 11): the only place a value is written.

One file per project under `<data dir>/secrets` (the directory mode 0700, each file 0600), named
by the SHA-256 of the project's canonical path, holding `{name: {"value": ..., "setAt": ...}}` as
JSON (`setAt`: when the log recorded the value set, ISO 8601, which says which of two replicas'
copies is newer; a bare value, as older data dirs hold, or one stored before its set was logged,
has none). A write goes to a
temporary file that is synced, renamed over the old one and its directory synced: a kill at any
point leaves the old file or the new one, whole. Which names a project has is the event log's
(domain/project_secrets.py); a value here whose name the log does not record (a kill between this
write and the log's) is never given to a hook, and setting it again records it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from bb_environments.providers.host.durable_files import remove_durably, write_durably


@dataclass(frozen=True)
class StoredSecret:
    value: str
    set_at: str | None
    """When the log recorded it set (ISO 8601); None: not known."""


class SecretStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()

    def values(self, project_path: str) -> dict[str, str]:
        """The project's values by name (none: an empty dict)."""
        return {name: stored.value for name, stored in self.entries(project_path).items()}

    def entries(self, project_path: str) -> dict[str, StoredSecret]:
        try:
            stored = json.loads(self._file(project_path).read_text())
        except FileNotFoundError:
            return {}
        return {str(name): _entry(held) for name, held in stored.items()}

    def holds_any(self) -> bool:
        """Whether any project has a value here: a hook of a service with no secrets asks nothing more."""
        try:
            with os.scandir(self.directory) as entries:
                return any(entry.name.endswith(".json") for entry in entries)
        except FileNotFoundError:
            return False

    def put(self, project_path: str, name: str, value: str, set_at: str | None = None) -> None:
        with self._lock:
            self._write(project_path, {**self.entries(project_path), name: StoredSecret(value, set_at)})

    def delete(self, project_path: str, name: str) -> None:
        with self._lock:
            values = self.entries(project_path)
            if name in values:
                del values[name]
                self._write(project_path, values)

    def _file(self, project_path: str) -> Path:
        return self.directory / f"{hashlib.sha256(project_path.encode()).hexdigest()}.json"

    def _write(self, project_path: str, values: dict[str, StoredSecret]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        path = self._file(project_path)
        if not values:
            remove_durably(path)
        else:
            stored = {name: {"value": held.value, "setAt": held.set_at} for name, held in values.items()}
            write_durably(path, json.dumps(stored).encode())


def _entry(held: object) -> StoredSecret:
    if isinstance(held, dict):
        set_at = held.get("setAt")
        return StoredSecret(str(held["value"]), None if set_at is None else str(set_at))
    return StoredSecret(str(held), None)
