"""What each live environment holds on its host besides its path: a block of ports and a name (SPEC 11).

Both are chosen when the environment is claimed and recorded with the claim, in the same save. A
host's leases are decided together (`HostLeases`), each against every live one there: a single
writer against its index of the log (handlers/claiming.py), a store several core replicas write in
the host's HostClaims aggregate, whose optimistic concurrency makes the second of two replicas that
chose from the same version decide again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Self
from uuid import UUID

from bb_environments.domain.errors import LimitReached

SLUG_MAX = 40
SLUG_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
_SHORT_ID_WIDTHS = (4, 6, 8, 12, 32)
"""How many hex digits of a random token a slug ends with: more only when the shorter are taken."""


class NoFreePorts(LimitReached):
    """The host's port range has no free block of the size each environment leases."""


@dataclass(frozen=True)
class PortRange:
    """Where blocks are leased from on every host (BB_PORT_RANGE, BB_PORTS_PER_ENVIRONMENT)."""

    first: int = 20000
    last: int = 29999
    per_environment: int = 10

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass(frozen=True, order=True)
class PortBlock:
    """`count` consecutive ports from `first`."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def recorded(self) -> dict[str, int]:
        """As an event records it (and the environment document shows it)."""
        return {"first": self.first, "count": self.count}

    @classmethod
    def from_recorded(cls, recorded: dict[str, int] | None) -> Self | None:
        return None if recorded is None else cls(recorded["first"], recorded["count"])


def slug_base(project_path: str | None, provider_id: str) -> str:
    """The readable part of a slug: the project's directory name (else the provider's id), in the
    letters a database, container or Compose project name takes, starting with a letter."""
    name = PurePosixPath(project_path).name if project_path else provider_id
    text = re.sub(r"[^a-z0-9]+", "-", name.lower())
    return re.sub(r"^[^a-z]+", "", text).strip("-") or "env"


class HostLeases:
    """The port blocks and slugs the live environments of one host hold."""

    def __init__(self) -> None:
        self._leases: dict[UUID, tuple[str | None, PortBlock | None]] = {}
        self._slugs: dict[str, UUID] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        # Its containers hold only strings, UUIDs and frozen blocks: copying them is a full copy.
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        copied._leases = dict(self._leases)
        copied._slugs = dict(self._slugs)
        return copied

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostLeases) and other._leases == self._leases

    def of(self, environment_id: UUID) -> tuple[str | None, PortBlock | None]:
        return self._leases.get(environment_id, (None, None))

    def lease(self, environment_id: UUID, slug: str | None, block: PortBlock | None) -> None:
        self.end(environment_id)
        self._leases[environment_id] = (slug, block)
        if slug is not None:
            self._slugs[slug] = environment_id

    def end(self, environment_id: UUID) -> None:
        slug, _ = self._leases.pop(environment_id, (None, None))
        if slug is not None:
            del self._slugs[slug]

    def free_slug(self, base: str, token: str) -> str:
        """`base` with as many hex digits of the random `token` as make it unused on the host."""
        for width in _SHORT_ID_WIDTHS:
            readable = base[: SLUG_MAX - 1 - width].rstrip("-") or "e"
            slug = f"{readable}-{token[:width]}"
            if slug not in self._slugs:
                return slug
        raise AssertionError("a random token of 32 hex digits is taken on the host")

    def free_block(self, host_id: str, ports: PortRange, listening: Iterable[int]) -> PortBlock:
        """The lowest block of the range that overlaps no leased block and no listening port."""
        held = sorted(block for _, block in self._leases.values() if block is not None)
        busy = sorted(port for port in set(listening) if ports.first <= port <= ports.last)
        taken = sorted([(block.first, block.last) for block in held] + [(port, port) for port in busy])
        start = ports.first
        for low, high in taken:
            if low >= start + ports.per_environment:
                break
            start = max(start, high + 1)
        if start + ports.per_environment - 1 <= ports.last:
            return PortBlock(start, ports.per_environment)
        leased = ", ".join(str(block) for block in held[:8]) + (", ..." if len(held) > 8 else "")
        listened = ", ".join(str(port) for port in busy[:8]) + (", ..." if len(busy) > 8 else "")
        raise NoFreePorts(
            f"host {host_id} has no {ports.per_environment} free consecutive ports left in BB_PORT_RANGE "
            f"({ports}): leased to live environments: {leased or 'none'}; already listening: {listened or 'none'}. "
            "Remove an environment, widen BB_PORT_RANGE or lower BB_PORTS_PER_ENVIRONMENT"
        )

    def recorded(self) -> dict[str, dict[str, Any]]:
        """Each environment's lease, as an event or a snapshot records it."""
        return {
            str(environment_id): {"slug": slug, "ports": block.recorded() if block else None}
            for environment_id, (slug, block) in self._leases.items()
        }

    @classmethod
    def from_recorded(cls, recorded: dict[str, dict[str, Any]] | None) -> Self:
        leases = cls()
        for environment_id, lease in (recorded or {}).items():
            leases.lease(UUID(environment_id), lease["slug"], PortBlock.from_recorded(lease["ports"]))
        return leases
