"""A cheaper copy of an aggregate for a command to change (see Environments' `_changing_*` lookups)."""

from __future__ import annotations

from copy import deepcopy
from datetime import datetime
from enum import Enum
from typing import Any, Self
from uuid import UUID

# Values nobody can change in place: the copy may share them with the cached aggregate. Exact
# types, since a subclass may carry attributes of its own; enum members are singletons anyway.
_IMMUTABLE = frozenset((str, int, float, bool, type(None), UUID, datetime))


class CopiedForCommands:
    """Every command copies the cached aggregate it changes, so a command that fails half way leaves
    the cache as it was. `copy.deepcopy` rebuilds every attribute, each id and timestamp included
    (a tenth of a millisecond per environment, several times per spawn); this copy shares the
    immutable values and deep-copies the rest (lists, dicts, pending events): a command can change
    nothing of the cached aggregate through it, as with the full copy."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(
            {
                name: value if type(value) in _IMMUTABLE or isinstance(value, Enum) else deepcopy(value, memo)
                for name, value in self.__dict__.items()
            }
        )
        return copied
