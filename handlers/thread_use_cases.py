"""The threads' use cases: register a thread, give it the environment its first message asks for
(a new one, claimed with its path and leases, or one it joins), refuse it, archive, unarchive and
cancel. Each loads what it changes and saves it in one transaction (handlers/application.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import IllegalTransition
from bb_environments.domain.leases import slug_base
from bb_environments.domain.pool import Pool, pool_id
from bb_environments.domain.status import ThreadStatus
from bb_environments.domain.thread import Thread
from bb_environments.handlers.indexed_application import IndexedApplication
from bb_environments.handlers.placement import Placement


class ThreadUseCases(IndexedApplication):
    def register_thread(
        self,
        thread_id: str,
        project_path: str | None,
        parent_thread_id: str | None,
        host_id: str,
        intent: dict[str, Any] | None,
    ) -> Thread:
        """Register the thread (once)."""
        existing = self.find_thread(thread_id)
        if existing is not None:
            return existing
        thread = Thread(
            thread_id=thread_id,
            project_path=project_path,
            parent_thread_id=parent_thread_id,
            host_id=host_id,
            intent=intent,
        )
        self.save(thread)
        return thread

    def spawn_thread(
        self,
        thread_id: str,
        project_path: str | None,
        parent_thread_id: str | None,
        host_id: str,
        intent: dict[str, Any] | None,
        target: UUID | Placement,
    ) -> Environment:
        """Register a new thread, its first message's request and the environment it gets (`target`
        joined, or placed new) in one save: a refused spawn leaves no thread behind."""
        if self.find_thread(thread_id) is not None:
            raise IllegalTransition(f"thread {thread_id} already exists")
        thread = Thread(
            thread_id=thread_id,
            project_path=project_path,
            parent_thread_id=parent_thread_id,
            host_id=host_id,
            intent=intent,
        )
        thread.request_environment()
        environment, changed = self._provide(thread, target)
        self.save(*changed)
        return environment

    def threads_awaiting_environment(self) -> list[str]:
        threads: Iterator[Thread] = (self.repository.get(identity) for identity in self._awaiting.thread_ids())
        return [thread.thread_id for thread in threads if thread.awaits_environment]

    def refuse_thread(self, thread_id: str, message: str) -> None:
        """Refuse the environment the thread's first message asked for (the request is recorded
        with the refusal, if it was not yet)."""
        thread = self._changing_thread(thread_id)
        if thread.needs_environment and thread.refusal != message:
            thread.request_environment()
            thread.refuse(message)
            self.save(thread)

    def answer_first_message(self, thread_id: str, target: UUID | Placement) -> Environment:
        """Record the request of the thread's first message and give it its environment (`target`
        joined, or placed new), in one save."""
        thread = self._changing_thread(thread_id)
        thread.request_environment()
        environment, changed = self._provide(thread, target)
        self.save(*changed)
        return environment

    def provide_environment(self, thread_id: str, target: UUID | Placement) -> Environment:
        """Give the thread the environment its first message asked for: join `target`, or claim
        the placed new one."""
        environment, changed = self._provide(self._changing_thread(thread_id), target)
        self.save(*changed)
        return environment

    def claim_environment(
        self,
        thread_id: str,
        provider_id: str,
        host_id: str,
        project_path: str | None,
        inputs: Any,
        path_key: str,
        claimed_path: str | None,
        share_held_path: bool = False,
    ) -> Environment:
        placement = Placement(provider_id, host_id, project_path, inputs, path_key, claimed_path, share_held_path)
        return self.provide_environment(thread_id, placement)

    def attach_thread(self, thread_id: str, environment_id: UUID) -> Environment:
        return self.provide_environment(thread_id, environment_id)

    def _provide(self, thread: Thread, target: UUID | Placement) -> tuple[Environment, list[Aggregate]]:
        """The thread's environment and every aggregate changed to give it, not saved yet."""
        if isinstance(target, UUID):
            return self._attach(thread, target)
        return self._new_environment(thread, target)

    def _new_environment(self, thread: Thread, placement: Placement) -> tuple[Environment, list[Aggregate]]:
        """Reserve a new environment for the thread and claim its path, all or nothing.

        A path held by an environment of the same provider is no conflict in two cases. With
        `shares_claimed_path`, the thread joins that environment if it takes threads. Otherwise,
        an idle holder that does not own the path gives it up: its removal starts in the same save.
        """
        if thread.environment_id is not None:
            return self.environment(thread.environment_id), []
        if thread.status != ThreadStatus.ACTIVE:
            raise IllegalTransition(f"thread {thread.thread_id} is archived")
        host_id, claimed_path = placement.host_id, placement.claimed_path
        holder = self._holder(host_id, claimed_path, placement.provider_id) if claimed_path else None
        if placement.shares_claimed_path and holder is not None and holder.takes_threads:
            return self._attach(thread, holder.id)
        taken = self._take_member(thread, placement)
        if taken is not None:
            return taken
        replaced = holder if holder is not None and holder.can_give_up_path else None
        spare = self._spare_member(placement) if replaced is None else None
        environment, changed = self._claim(
            placement, thread.thread_id, replaced, handed_on=spare[1].id if spare else None
        )
        thread.assign_environment(environment.id)
        return environment, [environment, thread, *changed, *(spare or ())]

    def _claim(
        self,
        placement: Placement,
        thread_id: str,
        replaced: Environment | None = None,
        member_of: str | None = None,
        handed_on: UUID | None = None,
    ) -> tuple[Environment, list[Aggregate]]:
        """A new environment where `placement` says, with its path claimed and its slug and ports
        leased on its host (for `thread_id`, or a member of pool `member_of`, prepared where the
        placement read the base's head); `replaced` gives up the path in the same save, and
        `handed_on` (a pool's member removed in the same save) makes room for it too. Not saved
        yet: the environment, and the other aggregates changed."""
        host_id, claimed_path, head = placement.host_id, placement.claimed_path, placement.base_head
        claims = self.claims.on_host(host_id)
        claims.load()
        # One whose removal this save starts does not count: its place is handed on.
        self._live.refuse_past(
            self.limits, host_id, placement.project_path, handed_on=replaced.id if replaced else handed_on
        )
        # The block is chosen against the ports the host's plan found listening: one placed while
        # the host was away leases its block when it is planned there (record_planned).
        slug, ports = claims.choose_lease(
            slug_base(placement.project_path, placement.provider_id),
            self.ports if placement.planned else None,
            placement.listening,
        )
        environment = Environment(
            provider_id=placement.provider_id,
            host_id=host_id,
            project_path=placement.project_path,
            inputs=placement.inputs,
            path_key=placement.path_key,
            claimed_path=claimed_path,
            thread_id=thread_id,
            **({} if placement.planned else {"planned": False}),
            slug=slug,
            ports=ports.recorded() if ports else None,
            pool_id=member_of,
            base_commit=head.base_commit if member_of and head else None,
            setup_hash=head.setup_hash if member_of and head else None,
        )
        claims.lease(environment.id, slug, ports)
        if replaced is not None:
            replaced.give_up_path()
        if claimed_path:
            claims.take(claimed_path, environment.id, replaced.id if replaced else None)
        return environment, [*([replaced] if replaced else []), *claims.changed]

    def _spare_member(self, placement: Placement) -> tuple[Pool, Environment] | None:
        """At a live limit (SPEC 9), a pool's member no thread took, on the placement's host (and
        in its project, when that is the limit reached), dropped from its pool and removed in the
        thread's save to make room for it: a pool never keeps a thread from an environment. The
        pool and the member, changed, or None."""
        host_id, project_path = placement.host_id, placement.project_path
        host_full = self._live.on_host(host_id) >= self.limits.per_host
        project_full = (
            project_path is not None and self._live.in_project(host_id, project_path) >= self.limits.per_project
        )
        if not (host_full or project_full):
            return None
        pools = self.find_pool_list()
        for identity in pools.pool_ids if pools is not None else []:
            pool = self.pool(identity, to_change=True)
            if pool.host_id != host_id or (project_full and pool.project_path != project_path):
                continue
            for member_id in pool.members:
                member = self._changing_environment(member_id)
                if member.is_live and not member.cancelled and member.retire_at is None:
                    pool.let_go(member.id, "surplus")
                    member.request_deletion()
                    return pool, member
        return None

    def _take_member(self, thread: Thread, placement: Placement) -> tuple[Environment, list[Aggregate]] | None:
        """A ready member of the pool that holds what the thread asks for, prepared where the host
        read the base's head for this placement, bound to the thread; None when none is (SPEC 10).
        Saved with the pool and the thread: two writers that took from one version conflict."""
        head = placement.base_head
        if head is None:
            return None
        key = pool_id(placement.host_id, placement.project_path, placement.provider_id, placement.inputs)
        pool = self.find_pool(key, to_change=True)
        if pool is None:
            return None
        for member_id in pool.members:
            member = self._changing_environment(member_id)
            if member.pooled and member.prepared_on(head.base_commit, head.setup_hash):
                member.bind(thread.thread_id, placement.inputs, placement.path_key)
                pool.let_go(member.id, "bound")
                thread.assign_environment(member.id)
                return member, [member, thread, pool]
        return None

    def _holder(self, host_id: str, path: str, provider_id: str) -> Environment | None:
        """The environment of `provider_id` that holds exactly `path`, if one does."""
        holder_id = self.claims.holder(host_id, path)
        if holder_id is None:
            return None
        holder = self._changing_environment(holder_id)
        return holder if holder.provider_id == provider_id else None

    def _attach(self, thread: Thread, environment_id: UUID) -> tuple[Environment, list[Aggregate]]:
        environment = self._changing_environment(environment_id)
        if thread.environment_id not in (None, environment_id):
            raise IllegalTransition(f"thread {thread.thread_id} already uses environment {thread.environment_id}")
        environment.attach_thread(thread.thread_id)
        thread.assign_environment(environment_id)
        return environment, [environment, thread]

    def archive_thread(self, thread_id: str, now: datetime) -> Environment | None:
        thread = self._changing_thread(thread_id)
        if not thread.archive():
            return None
        environment = self._environment_of(thread)
        if environment is not None:
            environment.detach_thread(thread_id, now, self._grace_for(environment.provider_id))
        self.save(thread, *([environment] if environment else []))
        return environment

    def unarchive_thread(self, thread_id: str) -> Environment | None:
        thread = self._changing_thread(thread_id)
        if not thread.unarchive():
            return None
        environment = self._environment_of(thread)
        if environment is not None and environment.is_live and not environment.cancelled:
            environment.attach_thread(thread_id)
        else:
            thread.leave_environment()
            environment = None
        self.save(thread, *([environment] if environment else []))
        return environment

    def cancel_thread_message(self, thread_id: str) -> Environment | None:
        thread = self._changing_thread(thread_id)
        environment = self._environment_of(thread)
        if environment is None or not environment.cancel_for_thread(thread_id):
            return None
        thread.leave_environment()
        self.save(environment, thread)
        return environment

    def _environment_of(self, thread: Thread) -> Environment | None:
        return self._changing_environment(thread.environment_id) if thread.environment_id else None
