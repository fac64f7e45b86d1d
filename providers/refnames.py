"""Branch-name validation with the rules of `git check-ref-format --branch`, without running git,
and the check a revision (a commit-ish such as `main~1`) passes before git resolves it.

Names are checked before they reach any git command line, so a hostile name can never be read
as an option or a path.
"""

from __future__ import annotations

from bb_environments.providers.contract import InvalidInputs

MAX_BRANCH_NAME_LENGTH = 200
FORBIDDEN_CHARACTERS = frozenset(" ~^:?*[\\")


def validate_branch_name(name: str, field: str = "branch.name") -> None:
    """Raise InvalidInputs naming `field`, the value and the rule when `name` is not a valid branch."""
    broken_rule = _broken_rule(name)
    if broken_rule is not None:
        raise InvalidInputs(f"{field}: {name!r} is not a valid branch name: it {broken_rule}.")


def validate_revision(revision: str, field: str = "branch.base") -> None:
    """Raise InvalidInputs naming `field` when `revision` could be read as an option or is not text
    git can resolve; whether it names a commit is git's to answer (`rev-parse --end-of-options`)."""
    broken_rule: str | None
    if revision == "":
        broken_rule = "is empty"
    elif revision.startswith("-"):
        broken_rule = "starts with '-'"
    else:
        bad_character = next((c for c in revision if _is_control_character(c)), None)
        broken_rule = None if bad_character is None else f"contains the control character {bad_character!r}"
    if broken_rule is not None:
        raise InvalidInputs(
            f"{field}: {revision!r} is not a commit-ish (a branch, tag, commit id or an "
            f"expression like main~1): it {broken_rule}."
        )


def _broken_rule(name: str) -> str | None:
    if name == "":
        return "is empty"
    if name.startswith("refs/"):
        # Only `refs/heads/` is a branch; the inputs already took that prefix off (branch_inputs).
        return "starts with 'refs/'; give the branch's own name, as in 'x' for refs/heads/x"
    if len(name) > MAX_BRANCH_NAME_LENGTH:
        return f"is longer than {MAX_BRANCH_NAME_LENGTH} characters"
    if name.startswith("-"):
        return "starts with '-'"
    if name in ("@", "HEAD"):
        return f"is exactly {name!r}"
    if name.endswith("/"):
        return "ends with '/'"
    if name.endswith("."):
        return "ends with '.'"
    for substring in ("..", "//", "@{"):
        if substring in name:
            return f"contains {substring!r}"
    bad_character = next((c for c in name if _is_forbidden_character(c)), None)
    if bad_character is not None:
        return f"contains the forbidden character {bad_character!r}"
    for component in name.split("/"):
        if component == "":
            return "has an empty path component"
        if component.startswith("."):
            return f"has a component starting with '.' ({component!r})"
        if component.endswith(".lock"):
            return f"has a component ending with '.lock' ({component!r})"
    return None


def _is_forbidden_character(character: str) -> bool:
    return _is_control_character(character) or character in FORBIDDEN_CHARACTERS


def _is_control_character(character: str) -> bool:
    return ord(character) < 0x20 or ord(character) == 0x7F
