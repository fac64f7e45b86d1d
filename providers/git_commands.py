"""Running git for providers: one repository per call, sanitized environment, one-line errors.

User text must be validated before it reaches these helpers and placed behind `--` or
`--end-of-options`; these functions pass arguments through unchanged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TypeGuard

from bb_environments.providers.git_hooks import git_hooks_mode
from bb_environments.providers.host.withheld import without_secrets

GIT_TIMEOUT_SECONDS = 900
# Variables that would point git at another repository than the one we pass with -C.
REPO_LOCATION_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")
WITHOUT_REPOSITORY_HOOKS = ("-c", "core.hooksPath=/dev/null")
"""Options before a git subcommand that keep the repository's own git hooks from running: a
setup script may plant `.git/hooks/post-checkout` in the shared git dir, which our next `worktree
add` would otherwise run outside any hook supervision (SPEC 9). git looks a hook up as
`<hooksPath>/<name>`, which under /dev/null is never a file."""
OWED_POST_CHECKOUT = "bb-owed-post-checkout"
"""The file in a workspace's own git dir that names the post-checkout hook its checkout owes
(see owe_post_checkout)."""
NULL_OID = "0" * 40
_OBJECT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


class GitFailed(Exception):
    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def run_git(
    repo: str,
    *args: str,
    environment: Mapping[str, str] | None = None,
    options: tuple[str, ...] = WITHOUT_REPOSITORY_HOOKS,
) -> str:
    """Run git in `repo` and return its stripped stdout; raise GitFailed with one line of stderr.
    `environment` adds variables (a temporary index, an identity) to the sanitized ones; `options`
    go before the subcommand."""
    try:
        completed = subprocess.run(
            ["git", *options, "-C", repo, *args],
            capture_output=True,
            # A file name is bytes: one that is not UTF-8 comes back as it would go to git again.
            encoding="utf-8",
            errors="surrogateescape",
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


def owe_post_checkout(workspace: str, environment_id: str, previous_head: str) -> None:
    """Under BB_GIT_HOOKS=run, note in the workspace's git dir that the checkout our git just made
    there, from `previous_head`, owes the repository's post-checkout hook to the setup of
    `environment_id`; nothing when the repository has no such hook (git runs only an executable
    one). The hook is looked up where git would, the repository's core.hooksPath included."""
    if git_hooks_mode() != "run":
        return
    hook = run_git(workspace, "rev-parse", "--path-format=absolute", "--git-path", "hooks/post-checkout", options=())
    if not (os.path.isfile(hook) and os.access(hook, os.X_OK)):
        return
    git_dir = run_git(workspace, "rev-parse", "--absolute-git-dir")
    head = run_git(workspace, "rev-parse", "--verify", "HEAD")
    # The arguments git gives post-checkout: the previous HEAD, the new one, 1 for a branch checkout.
    note = {"environment": environment_id, "command": [hook, previous_head, head, "1"]}
    Path(git_dir, OWED_POST_CHECKOUT).write_text(json.dumps(note))


def take_owed_post_checkout(workspace: Path, environment_id: str) -> list[str] | None:
    """The post-checkout command the workspace's checkout owes to the setup of `environment_id`,
    taken: the note is gone afterwards, so the hook runs at most once. A note for another
    environment (one removed before its setup ran, in a checkout a later one reuses) is dropped.
    Reads the workspace's `.git` itself rather than asking git, which would refuse a workspace
    that BB_WORKSPACE_USER owns."""
    git_dir = _git_dir_of(workspace)
    if git_dir is None:
        return None
    note_path = git_dir / OWED_POST_CHECKOUT
    try:
        note = json.loads(note_path.read_text())
        note_path.unlink()
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        note_path.unlink(missing_ok=True)
        return None
    if not isinstance(note, dict) or note.get("environment") != environment_id:
        return None
    command = note.get("command")
    return command if _is_post_checkout_command(command) else None


def _git_dir_of(workspace: Path) -> Path | None:
    """The git dir of a checkout's top level: `.git` itself, or where a linked worktree's `.git` file points."""
    entry = workspace / ".git"
    if entry.is_dir():
        return entry
    try:
        pointer = entry.read_text()
    except OSError:
        return None
    if not pointer.startswith("gitdir: "):
        return None
    return (workspace / pointer.removeprefix("gitdir: ").strip()).resolve()


def _is_post_checkout_command(command: object) -> TypeGuard[list[str]]:
    return (
        isinstance(command, list)
        and len(command) == 4
        and all(isinstance(word, str) for word in command)
        and os.path.isabs(command[0])
        and all(_OBJECT_ID.fullmatch(oid) for oid in command[1:3])
        and command[3] == "1"
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
                return _with_listed(line.removeprefix(prefix), stderr.splitlines()[index + 1 :])
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
