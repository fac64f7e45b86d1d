"""What a core replica writes in the replicas' buckets (its presence, who holds a lease) and tells
the other replicas (a thread's activity)."""

from __future__ import annotations

from typing import Literal

import msgspec


class ReplicaPresence(msgspec.Struct, frozen=True, rename="camel"):
    """A running `bb serve` among the replicas of one store, rewritten every few seconds."""

    replica_id: str
    pid: int
    machine: str
    """The hostname of the machine it runs on (for the operator reading a refusal)."""
    data_dir: str
    store: str
    """The event store's kind: `sqlite` (one replica only) or `postgresql`."""
    started_at: str


class LeaseHolder(msgspec.Struct, frozen=True, rename="camel"):
    replica_id: str
    token: str
    """This run of that replica's: a restarted replica does not take its earlier run's lease for its own."""


class EnvironmentActivity(msgspec.Struct, frozen=True, rename="camel"):
    """A thread of the environment sent a message, heard by the replica whose partition got it."""

    environment_id: str


class ReplicaSecret(msgspec.Struct, frozen=True, rename="camel"):
    """A project's secret (SPEC 11) between replicas: `set` with its value and when the log recorded
    it, `removed`, or `send` (no name): the asker wants the project's values the answerer holds."""

    kind: Literal["set", "removed", "send"]
    project_path: str
    name: str = ""
    value: str = ""
    set_at: str = ""


class ReplicaSecretsHeld(msgspec.Struct, frozen=True, rename="camel"):
    """The answer to `send`: the values the answerer holds as the log has them."""

    secrets: list[ReplicaSecret]
