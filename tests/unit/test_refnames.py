import subprocess
from pathlib import Path

import msgspec
import pytest

from bb_environments.providers.branch_inputs import ExistingBranch, NewBranch
from bb_environments.providers.contract import InvalidInputs
from bb_environments.providers.refnames import validate_branch_name, validate_revision

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


@pytest.mark.parametrize("name", ["refs/tags/v1", "refs/remotes/origin/main", "refs/heads"])
def test_full_ref_names_other_than_a_branch_are_refused_with_a_hint(name: str) -> None:
    with pytest.raises(InvalidInputs) as refused:
        validate_branch_name(name)
    assert str(refused.value) == (
        f"branch.name: {name!r} is not a valid branch name: it starts with 'refs/'; "
        "give the branch's own name, as in 'x' for refs/heads/x."
    )


def test_a_full_branch_ref_in_the_inputs_means_the_branch_itself() -> None:
    raw = [
        {"kind": "existing", "name": "refs/heads/x"},
        {"kind": "new", "name": "refs/heads/x", "base": "refs/heads/main"},
    ]
    decoded = msgspec.convert(raw, list[ExistingBranch | NewBranch])
    assert decoded == [ExistingBranch("x"), NewBranch("x", base="refs/heads/main")]  # a base is any commit-ish
    assert msgspec.to_builtins(decoded)[0] == {"kind": "existing", "name": "x"}  # what the log records


@pytest.mark.parametrize(
    "revision", ["main", "main~0", "HEAD^", "v1.0^{commit}", "a1b2c3d", "refs/heads/main", "@{-1}"]
)
def test_any_commit_ish_passes_the_revision_check(revision: str) -> None:
    validate_revision(revision)


@pytest.mark.parametrize("revision", ["", "-f", "--upload-pack=x", "main\nx", "tab\there", "nul\0byte"])
def test_revisions_git_could_read_as_options_or_that_carry_control_characters_are_refused(revision: str) -> None:
    with pytest.raises(InvalidInputs) as refused:
        validate_revision(revision, field="branch.base")
    assert str(refused.value).startswith(f"branch.base: {revision!r} is not a commit-ish (a branch, tag, commit id or")
