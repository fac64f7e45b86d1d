"""Running git for providers: one repository per call, sanitized environment, one-line errors.

User text must be validated before it reaches these helpers and placed behind `--` or
`--end-of-options`; these functions pass arguments through unchanged.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from bb_environments.providers.host.withheld import without_secrets

GIT_TIMEOUT_SECONDS = 900
# Variables that would point git at another repository than the one we pass with -C.
REPO_LOCATION_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")
WITHOUT_REPOSITORY_HOOKS = ("-c", "core.hooksPath=/dev/null")
"""Options before a git subcommand that keep the repository's own git hooks from running: a
setup script may plant `.git/hooks/post-checkout` in the shared git dir, which our next `worktree
add` would otherwise run outside any hook supervision (SPEC 9). git looks a hook up as
`<hooksPath>/<name>`, which under /dev/null is never a file."""


class GitFailed(Exception):
    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def run_git(repo: str, *args: str, environment: Mapping[str, str] | None = None) -> str:
    """Run git in `repo` and return its stripped stdout; raise GitFailed with one line of stderr.
    `environment` adds variables (a temporary index, an identity) to the sanitized ones."""
    try:
        completed = subprocess.run(
            ["git", *WITHOUT_REPOSITORY_HOOKS, "-C", repo, *args],
            capture_output=True,
            text=True,
            env=git_environment() | dict(environment or {}),
            timeout=GIT_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git {args[0]} timed out after {GIT_TIMEOUT_SECONDS} s") from None
    if completed.returncode != 0:
        raise GitFailed(_one_line(completed.stderr, args), transient=_is_lock_contention(completed.stderr))
    return completed.stdout.strip("\n")


def unsafe_refusal(directory: str, failed: GitFailed) -> str | None:
    """Why `directory` is refused when git refused it as owned by another user (its
    `safe.directory` check): for that reason, not as "not a git repository"; None otherwise."""
    if "dubious ownership" not in str(failed):
        return None
    return f"project path: git refuses to touch {directory}, which another user owns: {failed}"


def run_git_or_none(repo: str, *args: str, environment: Mapping[str, str] | None = None) -> str | None:
    try:
        return run_git(repo, *args, environment=environment)
    except GitFailed:
        return None


def branch_exists(repo: str, name: str) -> bool:
    return run_git_or_none(repo, "show-ref", "--verify", "--quiet", f"refs/heads/{name}") is not None


def is_commit(repo: str, revision: str) -> bool:
    return (
        run_git_or_none(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}")
        is not None
    )


def git_environment() -> dict[str, str]:
    """The environment every git of ours runs in: this process's, without secrets or variables that
    would point git elsewhere."""
    # Without secrets all the same: what the repository configures beyond hooks (a filter, an
    # fsmonitor command) is still its code.
    environment = {k: v for k, v in without_secrets(os.environ).items() if k not in REPO_LOCATION_VARIABLES}
    # C locale: the lock-contention check below reads git's English messages.
    return environment | {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


LISTED_AT_MOST = 5
"""Of the paths git lists after a message ending in ':', how many the one line names."""


def _one_line(stderr: str, args: tuple[str, ...]) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        for prefix in ("fatal: ", "error: "):
            if line.startswith(prefix):
                return _with_listed(line.removeprefix(prefix), stderr.splitlines()[index + 1:])
    return lines[-1] if lines else f"git {args[0]} failed"


def _with_listed(message: str, following: list[str]) -> str:
    """`message`, with the paths git lists under it (indented lines) when it ends in ':', as in
    "... would be overwritten by checkout:"; without them the line would not say which."""
    if not message.endswith(":"):
        return message
    listed = []
    for line in following:
        if not line.startswith(("\t", " ")) or not line.strip():
            break
        listed.append(line.strip())
    more = f" and {len(listed) - LISTED_AT_MOST} more" if len(listed) > LISTED_AT_MOST else ""
    return f"{message} {', '.join(listed[:LISTED_AT_MOST])}{more}" if listed else message


def _is_lock_contention(stderr: str) -> bool:
    # A lock file another git holds: the ref or index kind, and the config's own wording.
    return ".lock': File exists" in stderr or "could not lock config file" in stderr
