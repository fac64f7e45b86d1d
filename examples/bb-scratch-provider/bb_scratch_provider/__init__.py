"""`scratch`: an empty (or README-seeded) directory per attempt, under the provider's data dir.

A deliberately small example of a third-party provider. It only creates and removes the
directory; claims, hooks, retries, cancellation and retirement are the core's business.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Annotated

import msgspec

from bb_environments.providers.contract import (
    READY,
    Availability,
    CreateContext,
    Created,
    CreateResult,
    InvalidInputs,
    Policy,
    ProjectContext,
    RemoveContext,
    Removed,
    RemoveResult,
    Requires,
    translate_errors,
)

TEMPLATES = ("empty", "readme")
# The core builds path keys from thread ids; refuse anything that is not one plain path segment,
# so no key can ever point outside our root.
PATH_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ScratchInputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # A plain `str` so that `validate` can answer with the allowed values; the enum is only
    # published in the JSON Schema (`bb environment providers`) for clients to offer.
    template: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(TEMPLATES)})] = "empty"


class ScratchProvider:
    id = "scratch"
    display_name = "Scratch directory"
    requires = Requires()  # no project needed, and a project is not refused either
    # per-attempt: a retry gets a fresh directory instead of whatever a failed attempt left.
    policy = Policy(path_keys="per-attempt", retire_grace_ms=60_000)
    inputs_type = ScratchInputs

    def availability(self, ctx: ProjectContext) -> Availability:
        return READY  # needs nothing but the local filesystem

    def validate(self, ctx: ProjectContext) -> None:
        # Runs before anything is claimed or written, so it must only look, never change.
        if ctx.inputs.template not in TEMPLATES:
            raise InvalidInputs(f"template: {ctx.inputs.template!r} is not allowed; use one of {', '.join(TEMPLATES)}")

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str | None:
        # Known in advance, so the core claims it before create and no two environments share it.
        return str(_scratch_dir(ctx.data_dir, path_key))

    # [create]
    def create(self, ctx: CreateContext) -> CreateResult:
        # The core may ask again with the same path key after a crash: every step must be
        # safe to repeat (mkdir exist_ok, README overwritten with the same text).
        # translate_errors: a cancel, or one of these errors, ends the block; the failure is returned
        # after it (terminal: retrying would not fix a bad key or disk).
        with translate_errors(OSError, ValueError) as failed:
            ctx.raise_if_cancelled()
            path = _scratch_dir(ctx.data_dir, ctx.path_key)
            ctx.report.step(f"Preparing scratch directory ({ctx.inputs.template})")
            path.mkdir(parents=True, exist_ok=True)
            if ctx.inputs.template == "readme":
                (path / "README.md").write_text(f"# Scratch space for {ctx.thread_id or 'a thread'}\n")
            # owns_path: the directory is ours alone, so the core may run the setup/teardown hooks in it.
            return Created(path=str(path), owns_path=True)
        return failed.create_failed()

    # [/create]

    def remove(self, ctx: RemoveContext) -> RemoveResult:
        # Called for every attempt, also when create never returned (ctx.path is None), and maybe
        # more than once: derive the directory from the path key alone and treat "gone" as done.
        with translate_errors(OSError, ValueError) as failed:
            ctx.raise_if_cancelled()
            path = _scratch_dir(ctx.data_dir, ctx.path_key)
            if os.path.lexists(path):
                ctx.report.step(f"Removing scratch directory {path}")
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            return Removed()
        return failed.remove_failed()  # the core records it and tries again later


def _scratch_dir(data_dir: str, path_key: str) -> Path:
    if not PATH_KEY.fullmatch(path_key):
        raise ValueError(f"path key {path_key!r} is not a single plain path segment")
    return Path(os.path.abspath(data_dir)) / "scratch" / path_key
