"""The warm pools' use cases (SPEC 10): set a pool, resume it, list them, and what the refill
(handlers/pool_keeper.py) records: the base its host read, members dropped (stale, failed or
beyond the size) and members added. Binding a member to a thread is the thread's placement's
(handlers/thread_use_cases.py `_take_member`); a member's setup is counted by its pool in the
save that records it (handlers/provisioning_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate

from bb_environments.domain.environment import Environment
from bb_environments.domain.pool import Freshness, Pool, PoolList, pool_id
from bb_environments.domain.status import PREPARING_STATUSES, EnvironmentStatus
from bb_environments.handlers.placement import Placement
from bb_environments.handlers.thread_use_cases import ThreadUseCases


@dataclass(frozen=True)
class PoolState:
    """A pool with how many of its members are ready, being prepared, or stale (prepared on
    another base than the one its host read last; being removed)."""

    pool: Pool
    ready: int
    preparing: int
    stale: int


class PoolUseCases(ThreadUseCases):
    def set_pool(self, host_id: str, project_path: str | None, provider_id: str, inputs: Any, size: int) -> Pool:
        """Keep `size` ready members for the key (0 drains it); a pool set again keeps its id."""
        pool = self.find_pool(pool_id(host_id, project_path, provider_id, inputs), to_change=True)
        if pool is None:
            pool = Pool(host_id=host_id, project_path=project_path, provider_id=provider_id, inputs=inputs, size=size)
            pools = self._pool_list()
            pools.add(pool.id)
            self.save(pool, pools)
        elif pool.resize(size):
            self.save(pool)
        return pool

    def resume_pool(self, pool: UUID) -> Pool:
        changing = self.pool(pool, to_change=True)
        if changing.resume():
            self.save(changing)
        return changing

    def pool_ids(self) -> list[UUID]:
        found = self.find_pool_list()
        return list(found.pool_ids) if found is not None else []

    def has_pools(self) -> bool:
        found = self.find_pool_list()
        return found is not None and bool(found.pool_ids)

    def pool_states(self) -> list[PoolState]:
        states = []
        for identity in self.pool_ids():
            pool = self.pool(identity)
            members = [self.environment(member) for member in pool.members]
            fresh = [m for m in members if self._fresh(pool, m)]
            states.append(
                PoolState(
                    pool=pool,
                    ready=sum(1 for m in fresh if m.pooled),
                    preparing=sum(1 for m in fresh if m.status in PREPARING_STATUSES),
                    stale=len(members) - len(fresh),
                )
            )
        return states

    def threads_preparing(self, host_id: str) -> bool:
        """Whether a thread's own environment on the host is being created or set up now: a
        refill waits for it (SPEC 10)."""
        for identity in self._live.ids():
            environment = self.environment(identity)
            if (
                environment.host_id == host_id
                and environment.pool_id is None
                and environment.status in PREPARING_STATUSES
                and environment.thread_ids
            ):
                return True
        return False

    def refill_due(self, pool: UUID, head: Freshness) -> tuple[int, int]:
        """Record the base the pool's host read now, drop the members that no longer count (stale,
        failed, gone, or beyond the size), and say how many to prepare now (none while paused)
        and how many are being prepared."""
        changing = self.pool(pool, to_change=True)
        changed: list[Aggregate] = [changing]
        changing.see_base(head)
        kept: list[Environment] = []
        for member_id in list(changing.members):
            member = self._changing_environment(member_id)
            if self._fresh(changing, member) and member.status != EnvironmentStatus.ERROR:
                kept.append(member)
            else:
                changed.extend(self._drop(changing, member, "stale"))
        # Beyond the size: the ready ones are kept first, the ones still being prepared dropped first.
        kept.sort(key=lambda member: not member.pooled)
        for member in kept[changing.size :]:
            changed.extend(self._drop(changing, member, "surplus"))
        if changing.pending_events:
            self.save(*changed)
        due = 0 if changing.paused else max(0, changing.size - len(kept))
        return due, sum(1 for member in kept[: changing.size] if member.status in PREPARING_STATUSES)

    def add_member(self, pool: UUID, placement: Placement) -> Environment | None:
        """A new member of the pool where `placement` (planned for a member) says, unless the pool
        wants none now or its base moved since (the refill reads it again)."""
        changing = self.pool(pool, to_change=True)
        head = placement.base_head
        if head is None or changing.paused or changing.freshness != Freshness(head.base_commit, head.setup_hash):
            return None
        counted = sum(1 for member in changing.members if self._fresh(changing, self.environment(member)))
        if counted >= changing.size:
            return None
        environment, changed = self._claim(placement, "", member_of=str(changing.id))
        changing.add_member(environment.id)
        self.save(environment, *changed, changing)
        return environment

    def _pool_list(self) -> PoolList:
        return self.find_pool_list(to_change=True) or PoolList()

    @staticmethod
    def _fresh(pool: Pool, member: Environment) -> bool:
        head = pool.freshness
        return head is None or member.prepared_on(head.base_commit, head.setup_hash)

    @staticmethod
    def _drop(pool: Pool, member: Environment, why: str) -> list[Aggregate]:
        """The member no longer counts: it is removed (with its teardown), never bound."""
        pool.let_go(member.id, why)
        if member.is_live and not (member.cancelled or member.retire_at is not None):
            member.request_deletion()
        return [member] if member.pending_events else []
