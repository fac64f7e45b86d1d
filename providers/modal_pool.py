"""What the `modal-sandbox` provider does for a warm pool (SPEC 10): read where a member would be
prepared now, and tag a member's sandbox for the thread it is bound to.

A member is a sandbox created, cloned and set up ahead exactly as a thread's (`create`). Its
inputs (size and lifetime) name nothing of a thread's, so a member takes the request's own, and
the clone stays on the branch a thread's own create would leave it on: the origin's default.

The base is that branch's head at the origin, read with `git ls-remote` (the URL behind `--`);
the setup script's hash is read from the checkout's own objects, which hold the commit once it
was fetched or pushed from there. Until then the head is unknown (`BaseUnknown`): a thread binds
no member and the pool prepares none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bb_environments.domain.hook_operations import SCRIPT_NAMES
from bb_environments.providers.contract import BaseHead, BaseUnknown, BindFailed
from bb_environments.providers.git_commands import GitFailed, is_commit, run_git
from bb_environments.providers.git_repository import setup_hash_at
from bb_environments.providers.modal_sdk import ModalOperationFailed, ModalSdk, redact

BOUND_TAG = "bb-bound-to"
"""The tag a bound member's sandbox carries: its thread's path key (as a tag value)."""
BOUND_RESOURCE_KEY = "boundTo"
"""The same, in the resource: a resume starts the sandbox with it."""


ORIGIN_HEAD_FRESH_S = 5.0
"""How long the origin's head, once read, stands for it. A pool's refill asks every second and
each spawn of a pooled project asks too, and each `git ls-remote` is a round trip to the origin's
host (a forge that limits its rate): a push is seen within this, and members prepared meanwhile on
the head before it are found stale at the next read."""


class OriginHeads:
    """The heads of the projects' origins, each read again once ORIGIN_HEAD_FRESH_S old; a read
    that failed is not kept (the next one tries the origin again)."""

    def __init__(self, fresh_s: float = ORIGIN_HEAD_FRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._fresh_s = fresh_s
        self._clock = clock
        self._read: dict[tuple[str, str], tuple[float, str]] = {}  # (repo, origin) -> (read at, commit)
        self._lock = threading.Lock()  # the refill and spawns ask from worker threads

    def head(self, repo: str, origin: str, secrets: tuple[str, ...]) -> BaseHead:
        """The head of the origin's default branch (what a sandbox's clone checks out) and the
        sha256 of `.bb-env-setup.sh` at it; `secrets` are the parts of the URL no message may show."""
        now = self._clock()
        with self._lock:
            read_at, commit = self._read.get((repo, origin), (None, ""))
        if read_at is None or now - read_at >= self._fresh_s:
            commit = _listed_head(repo, origin, secrets)
            with self._lock:
                self._read[(repo, origin)] = (now, commit)
        return _base_at(repo, commit)


def _listed_head(repo: str, origin: str, secrets: tuple[str, ...]) -> str:
    try:
        listed = run_git(repo, "ls-remote", "--", origin, "HEAD")
    except GitFailed as failed:
        raise BaseUnknown(redact(f"could not read the head of the origin remote: {failed}", secrets)) from None
    commit = listed.partition("\t")[0].strip()
    if not commit:
        raise BaseUnknown("the origin remote has no default branch (HEAD) to clone")
    return commit


def _base_at(repo: str, commit: str) -> BaseHead:
    """Read from the checkout's objects each time: a `git fetch` there brings an unknown head."""
    if not is_commit(repo, commit):
        raise BaseUnknown(
            f"the origin's head {commit} is not in {repo} yet, so its {SCRIPT_NAMES['setup']} cannot be read: "
            "a `git fetch` there brings it"
        )
    return BaseHead(commit, setup_hash_at(repo, commit))


def bound_tags(resource: dict[str, Any]) -> dict[str, str]:
    """The tag of the thread a member was bound to, for a sandbox started from its snapshot."""
    bound_to = resource.get(BOUND_RESOURCE_KEY)
    return {BOUND_TAG: bound_to} if isinstance(bound_to, str) else {}


def bind_member(modal: ModalSdk, resource: dict[str, Any], bound_to: str) -> dict[str, Any]:
    """Tag the member's sandbox `bb-bound-to=<bound_to>`, keeping its other tags (Modal replaces
    the whole set). Found done (a repeat after a crash) when the sandbox carries that tag already.
    A member paused meanwhile has no sandbox: its resume starts one with the tag."""
    bound = {**resource, BOUND_RESOURCE_KEY: bound_to}
    sandbox_id = resource.get("sandboxId")
    if sandbox_id is None:
        if resource.get("snapshotId") is None:
            raise BindFailed("the member has neither a sandbox nor a snapshot to start one from")
        return bound
    try:
        with modal.connect() as session:
            found = session.sandbox_and_tags(sandbox_id, "find the member's sandbox")
            if found is None:
                raise BindFailed(f"the member's sandbox {sandbox_id} no longer exists")
            sandbox, tags = found
            if tags.get(BOUND_TAG) == bound_to:
                return bound
            if BOUND_TAG in tags:
                raise BindFailed(f"the member's sandbox {sandbox_id} is bound to {tags[BOUND_TAG]} already")
            if session.has_stopped(sandbox):
                raise BindFailed(f"the member's sandbox {sandbox_id} has stopped (its lifetime may have ended)")
            session.set_tags(sandbox, {**tags, BOUND_TAG: bound_to})
    except ModalOperationFailed as failed:
        raise BindFailed(str(failed)) from None
    return bound
