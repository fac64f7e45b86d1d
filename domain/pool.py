"""The Pool aggregate: how many ready environments one key (host, project, provider, inputs) keeps
ahead of its threads, which of them are its members now, whether it is paused, and the base
(commit and setup script) its members must be prepared on to be served (SPEC 10).

A member is an Environment of its own with `pool_id` (domain/environment.py). The pool lists the
members it still counts (being prepared, or ready and unbound); a member leaves the list when a
thread takes it (in the same save as the thread's placement) or when it is dropped (stale or
failed, in the same save as its deletion), so two writers that took or dropped from one version
of the pool conflict, and the loser decides again.

Its id is a hash of its key: `bb pool set` for a key names the same pool on every replica, and a
thread's placement finds its pool without an index.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from bb_environments.domain.copying import CopiedForCommands

POOL_LIST_ID = uuid5(NAMESPACE_URL, "bb-pools")


def matching_inputs(inputs: Any) -> Any:
    """A request's inputs as a pool compares them: equal apart from a new branch's `name`, which
    the binding gives the member (SPEC 10)."""
    if not isinstance(inputs, dict):
        return inputs
    branch = inputs.get("branch")
    if isinstance(branch, dict) and branch.get("kind") == "new":
        return {**inputs, "branch": {k: v for k, v in branch.items() if k != "name"}}
    return inputs


def pool_id(host_id: str, project_path: str | None, provider_id: str, inputs: Any) -> UUID:
    key = json.dumps([host_id, project_path, provider_id, matching_inputs(inputs)], sort_keys=True)
    return uuid5(NAMESPACE_URL, f"bb-pool:{key}")


class Freshness:
    """What a member was prepared on: the base's head commit and its setup script's content hash
    (None: the commit has no `.bb-env-setup.sh`)."""

    __slots__ = ("base_commit", "setup_hash")

    def __init__(self, base_commit: str, setup_hash: str | None) -> None:
        self.base_commit = base_commit
        self.setup_hash = setup_hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Freshness) and (self.base_commit, self.setup_hash) == (
            other.base_commit,
            other.setup_hash,
        )

    def __hash__(self) -> int:
        return hash((self.base_commit, self.setup_hash))


class Pool(CopiedForCommands, Aggregate):
    if TYPE_CHECKING:  # the event classes the @event decorators below define
        Set: ClassVar[type[Aggregate.Created]]
        Resized: ClassVar[type[Aggregate.Event]]
        BaseSeen: ClassVar[type[Aggregate.Event]]
        MemberAdded: ClassVar[type[Aggregate.Event]]
        MemberLeft: ClassVar[type[Aggregate.Event]]
        MemberFailed: ClassVar[type[Aggregate.Event]]
        MemberPooled: ClassVar[type[Aggregate.Event]]
        Paused: ClassVar[type[Aggregate.Event]]
        Resumed: ClassVar[type[Aggregate.Event]]

    @staticmethod
    def create_id(host_id: str, project_path: str | None, provider_id: str, inputs: Any, **_: Any) -> UUID:
        return pool_id(host_id, project_path, provider_id, inputs)

    @event("Set")
    def __init__(self, host_id: str, project_path: str | None, provider_id: str, inputs: Any, size: int) -> None:
        self.host_id = host_id
        self.project_path = project_path
        self.provider_id = provider_id
        self.inputs = inputs
        """As `bb pool set` gave them (its members are prepared from them); a thread's match them
        apart from a new branch's name."""
        self.size = size
        self.members: list[UUID] = []
        self.base_commit: str | None = None
        self.setup_hash: str | None = None
        self.failures = 0
        self.paused_reason: str | None = None
        self.paused_at: datetime | None = None

    @property
    def freshness(self) -> Freshness | None:
        return None if self.base_commit is None else Freshness(self.base_commit, self.setup_hash)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def resize(self, size: int) -> bool:
        if size == self.size:
            return False
        self._resized(size)
        return True

    def see_base(self, freshness: Freshness) -> bool:
        """The base's head as its host read it now: members prepared on another are stale."""
        if freshness == self.freshness:
            return False
        self._base_seen(freshness.base_commit, freshness.setup_hash)
        return True

    def add_member(self, environment_id: UUID) -> None:
        self._member_added(environment_id)

    def let_go(self, environment_id: UUID, why: str) -> bool:
        """The member is bound to a thread, or dropped (`why` says which): no longer counted."""
        if environment_id not in self.members:
            return False
        self._member_left(environment_id, why)
        return True

    def record_setup(
        self, environment_id: UUID, succeeded: bool, message: str | None, limit: int, now: datetime
    ) -> bool:
        """A member's setup ended: a success clears the failures in a row; the `limit`th failure in
        a row pauses the pool."""
        if environment_id not in self.members:
            return False
        if succeeded:
            self._member_pooled(environment_id)
            return True
        self._member_failed(environment_id, message or "setup failed")
        if self.failures >= limit and not self.paused:
            self._paused(f"{self.failures} member setups failed in a row; the last: {message or 'setup failed'}", now)
        return True

    def resume(self) -> bool:
        if not self.paused:
            return False
        self._resumed()
        return True

    @event("Resized")
    def _resized(self, size: int) -> None:
        self.size = size

    @event("BaseSeen")
    def _base_seen(self, base_commit: str, setup_hash: str | None) -> None:
        self.base_commit = base_commit
        self.setup_hash = setup_hash

    @event("MemberAdded")
    def _member_added(self, environment_id: UUID) -> None:
        self.members.append(environment_id)

    @event("MemberLeft")
    def _member_left(self, environment_id: UUID, why: str) -> None:
        self.members.remove(environment_id)

    @event("MemberPooled")
    def _member_pooled(self, environment_id: UUID) -> None:
        self.failures = 0

    @event("MemberFailed")
    def _member_failed(self, environment_id: UUID, message: str) -> None:
        self.failures += 1

    @event("Paused")
    def _paused(self, reason: str, at: datetime) -> None:
        self.paused_reason = reason
        self.paused_at = at

    @event("Resumed")
    def _resumed(self) -> None:
        self.paused_reason = None
        self.paused_at = None
        self.failures = 0


class PoolList(CopiedForCommands, Aggregate):
    """Every pool ever set, in the order set: what `bb pool list` and the refill read."""

    if TYPE_CHECKING:
        Started: ClassVar[type[Aggregate.Created]]
        Added: ClassVar[type[Aggregate.Event]]

    @staticmethod
    def create_id(**_: Any) -> UUID:
        return POOL_LIST_ID

    @event("Started")
    def __init__(self) -> None:
        self.pool_ids: list[UUID] = []

    def add(self, pool: UUID) -> None:
        if pool not in self.pool_ids:
            self._added(pool)

    @event("Added")
    def _added(self, pool_id: UUID) -> None:
        self.pool_ids.append(pool_id)
