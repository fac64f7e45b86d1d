import subprocess
from pathlib import Path

import pytest

from providers.contract import InvalidInputs
from providers.refnames import validate_branch_name

HOSTILE_NAMES = [
    "--upload-pack=x",
    "-b",
    "../x",
    "a..b",
    "has space",
    "x.lock",
    "a/x.lock/b",
    "",
    "a/.b",
    ".hidden",
    "a//b",
    "/a",
    "a/",
    "a.",
    "x@{1}",
    "@",
    "HEAD",
    "tab\there",
    "nul\0byte",
    "del\x7f",
    "tilde~1",
    "caret^",
    "colon:x",
    "question?",
    "star*",
    "bracket[",
    "back\\slash",
    "x" * 201,
]

VALID_NAMES = ["main", "feature/login", "bb/thread-1", "v1.2.3", "a@b", "user/ünïcode", "x" * 200]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_are_refused_with_field_and_value(name: str) -> None:
    with pytest.raises(InvalidInputs) as refused:
        validate_branch_name(name, field="branch.base")
    assert str(refused.value).startswith(f"branch.base: {name!r} is not a valid branch name: it ")


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_names_are_accepted(name: str) -> None:
    validate_branch_name(name)


# Left out: NUL (not passable in argv), over-long names (our own limit) and "@" (git expands it
# to the current branch; we refuse it as a name).
NAMES_GIT_CAN_JUDGE = [n for n in HOSTILE_NAMES + VALID_NAMES if "\0" not in n and len(n) <= 200 and n != "@"]


@pytest.mark.parametrize("name", NAMES_GIT_CAN_JUDGE)
def test_agrees_with_git_check_ref_format(name: str, tmp_path: Path) -> None:
    git_check = ["git", "check-ref-format", "--branch", name]
    git_accepts = subprocess.run(git_check, cwd=tmp_path, capture_output=True).returncode == 0
    try:
        validate_branch_name(name)
        we_accept = True
    except InvalidInputs:
        we_accept = False
    assert we_accept == git_accepts
