"""Branch choices shared by the providers' inputs: `{"kind": "existing", "name"}` and
`{"kind": "new", "name", "base"?}`. Each provider adds its own default kind and decides what a
missing `base` means."""

from __future__ import annotations

import msgspec
from msgspec.structs import force_setattr

FULL_BRANCH_PREFIX = "refs/heads/"


class BranchChoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind"):
    pass


class _NamedBranch(BranchChoice, frozen=True):
    name: str

    def __post_init__(self) -> None:
        # git would read `refs/heads/x` as the branch `refs/heads/refs/heads/x`; users mean `x`.
        # Done when the inputs are decoded, so the log and every provider call see the short name.
        force_setattr(self, "name", self.name.removeprefix(FULL_BRANCH_PREFIX))


class ExistingBranch(_NamedBranch, frozen=True, tag="existing"):
    pass


class NewBranch(_NamedBranch, frozen=True, tag="new"):
    base: str | None = None
