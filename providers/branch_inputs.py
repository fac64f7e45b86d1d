"""Branch choices shared by the providers' inputs: `{"kind": "existing", "name"}` and
`{"kind": "new", "name", "base"?}`. Each provider adds its own default kind and decides what a
missing `base` means."""

from __future__ import annotations

import msgspec


class BranchChoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind"):
    pass


class ExistingBranch(BranchChoice, tag="existing"):
    name: str


class NewBranch(BranchChoice, tag="new"):
    name: str
    base: str | None = None
