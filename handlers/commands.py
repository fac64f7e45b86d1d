"""The commands the thread handlers take, whoever sends them.

A raw NATS publisher's thread event and the CLI's `thread spawn` both arrive here as these values:
the bus decodes and validates its wire documents (`bus/wire/documents.py`) and translates them at the
edge, so the handlers never see a wire struct and the wire can change without touching them.

An intent is also kept in the log, on the thread's `Registered` event, as the document
`intent_document` writes; `intent_from_document` reads it back. That shape is the log's: it never
changes (old logs must load), whatever the wire does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NewEnvironment:
    """A new environment of a provider."""

    provider_id: str
    machine_host_id: str | None = None
    """The host of the machine the intent named, or None when it named no machine."""
    inputs: Any = None


@dataclass(frozen=True)
class ExistingEnvironment:
    """An environment that exists already, by its id as given (checked where it is used)."""

    environment_id: str


Intent = NewEnvironment | ExistingEnvironment


@dataclass(frozen=True)
class RegisterThread:
    """A thread became known (its `created` event, or a spawn)."""

    thread_id: str
    project_path: str | None = None
    parent_thread_id: str | None = None
    host_id: str | None = None
    environment: Intent | None = None


@dataclass(frozen=True)
class ProvideEnvironment:
    """The thread's message came: give it its environment, unless it has one."""

    thread_id: str


@dataclass(frozen=True)
class ArchiveThread:
    thread_id: str


@dataclass(frozen=True)
class UnarchiveThread:
    thread_id: str


@dataclass(frozen=True)
class CancelThreadMessage:
    thread_id: str


ThreadCommand = RegisterThread | ProvideEnvironment | ArchiveThread | UnarchiveThread | CancelThreadMessage


def intent_document(intent: Intent) -> dict[str, Any]:
    """The intent as the log keeps it (the same keys, in the same order, as it always has)."""
    if isinstance(intent, ExistingEnvironment):
        return {"type": "existing", "environmentId": intent.environment_id}
    machine = None if intent.machine_host_id is None else {"type": "existing", "hostId": intent.machine_host_id}
    return {
        "type": "provider",
        "environmentProviderId": intent.provider_id,
        "machine": machine,
        "inputs": intent.inputs,
    }


def intent_from_document(document: dict[str, Any]) -> Intent:
    """An intent the log kept (see `intent_document`)."""
    if document["type"] == "existing":
        return ExistingEnvironment(document["environmentId"])
    machine = document.get("machine")
    host = None if machine is None else machine.get("hostId")  # a machine without one: the thread's host
    return NewEnvironment(document["environmentProviderId"], host, document.get("inputs"))
