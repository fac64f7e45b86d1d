"""The nested-path rule: on one host, no live claim may lie inside or around another."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, Self
from uuid import UUID

from bb_environments.domain.errors import PathAlreadyClaimed


class HeldPaths:
    """The held paths of one host, searchable by nesting: a claim looks at the paths around and
    inside its own, not at every claim (there is one per environment ever placed)."""

    def __init__(self) -> None:
        self._holders: dict[str, UUID] = {}
        self._sorted: list[str] = []
        # Each held path under the root it is for `overlapping`; a tuple, replaced on a change, so
        # that a copy may share it.
        self._by_root: dict[str, tuple[str, ...]] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        """Every command that claims on a shared store copies its host's HostClaims, and so these:
        its containers hold only strings, UUIDs and tuples of strings, which nobody changes in place,
        so copying the containers is a full copy (`copy.deepcopy` rebuilt every UUID, a seventh of a
        replica's time in a burst, growing with the host's live environments)."""
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        copied._holders = dict(self._holders)
        copied._sorted = list(self._sorted)
        copied._by_root = dict(self._by_root)
        return copied

    def __eq__(self, other: object) -> bool:
        # The rest is an index of the holders: two with the same holders are the same.
        return isinstance(other, HeldPaths) and other._holders == self._holders

    def hold(self, path: str, holder: UUID) -> None:
        if path not in self._holders:
            bisect.insort(self._sorted, path)
            root = path.rstrip("/")
            self._by_root[root] = (*self._by_root.get(root, ()), path)
        self._holders[path] = holder

    def release(self, path: str) -> None:
        if self._holders.pop(path, None) is None:
            return
        del self._sorted[bisect.bisect_left(self._sorted, path)]
        root = path.rstrip("/")
        others = tuple(held for held in self._by_root[root] if held != path)
        if others:
            self._by_root[root] = others
        else:
            del self._by_root[root]

    def holder(self, path: str) -> UUID | None:
        return self._holders.get(path)

    def holders(self) -> dict[str, UUID]:
        """Every held path with its holder."""
        return dict(self._holders)

    def overlapping(self, path: str) -> Iterator[tuple[str, UUID]]:
        """Every held path that `path` is inside, or that is inside `path`, with its holder."""
        for end, character in enumerate(path):
            if character == "/":
                for around in self._by_root.get(path[:end], ()):
                    yield around, self._holders[around]
        prefix = path.rstrip("/") + "/"
        for position in range(bisect.bisect_left(self._sorted, prefix), len(self._sorted)):
            inner = self._sorted[position]
            if not inside(inner, path):
                return
            yield inner, self._holders[inner]


def refuse_nested(held: HeldPaths | None, path: str, environment_id: UUID) -> None:
    """Refuse `path` to the environment when it lies inside or around a path another environment
    holds (the same path is the claim's own rule: see PathClaim)."""
    for held_path, holder in held.overlapping(path) if held else ():
        if holder != environment_id and held_path != path:
            raise PathAlreadyClaimed(f"{path} overlaps {held_path}, held by environment {holder}")


def inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")
