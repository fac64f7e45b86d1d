"""Which names a project's secrets may have (SPEC 11): the variables its hooks get them as.

Apart from the aggregate so that the command line, which imports no event sourcing, refuses a bad
name before it reads a value."""

from __future__ import annotations

import re

from bb_environments.domain.ids import quoted

SECRET_NAME_RULE = (
    "an environment variable's name: letters, digits and '_', not starting with a digit, "
    "at most 128 characters, and not starting with BB_ (the service's own)"
)
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def secret_name_refusal(name: str) -> str | None:
    """Why `name` cannot be a secret's, or None when it can."""
    if _SECRET_NAME.fullmatch(name) is not None and not name.upper().startswith("BB_"):
        return None
    return f"secret name {quoted(name)} is not allowed: use {SECRET_NAME_RULE}"
