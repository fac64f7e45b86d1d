"""The steps the provisioning handler (handlers/provisioning.py) drives an environment through, each
recorded in one transaction with the claims and leases it takes or releases: created, planned,
setup, retry, removal, teardown, and what recovery asks of the log.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

from bb_environments.domain.environment import Environment
from bb_environments.domain.errors import PathAlreadyClaimed
from bb_environments.domain.hook_operations import MADE_EMPTY_REASON, RecordedHook
from bb_environments.domain.leases import NoFreePorts
from bb_environments.domain.pool import Pool
from bb_environments.domain.status import CreateFailure
from bb_environments.domain.steps import SkipSetup, StartSetup
from bb_environments.handlers.indexed_application import IndexedApplication

T = TypeVar("T")


class ProvisioningSteps(IndexedApplication):
    def _change(self, environment_id: UUID, change: Callable[[Environment], T]) -> tuple[Environment, T]:
        environment = self._changing_environment(environment_id)
        outcome = change(environment)
        self.save(environment)
        return environment, outcome

    def record_created(
        self,
        environment_id: UUID,
        attempt: int,
        path: str,
        owns_path: bool,
        merge_base_branch: str | None,
        resource: dict[str, Any] | None,
        empty: bool = False,
    ) -> Environment:
        """Record the provider's path, and the setup's start (or skip) it makes due; a path other than
        the claimed one is claimed in the same save. `empty`: the provider made the path just now
        and put nothing in it, so a setup due is skipped here rather than started on the host."""
        environment = self._changing_environment(environment_id)
        claims = self.claims.on_host(environment.host_id)
        if path != environment.claimed_path and attempt == environment.attempt:
            try:
                claims.take(path, environment.id)
            except PathAlreadyClaimed as refused:
                environment.record_create_failed(attempt, "terminal", f"{path} is already claimed: {refused}")
                self.save(environment)
                return environment
        if environment.record_created(attempt, path, owns_path, merge_base_branch, resource):
            _take_recording_step(environment, empty)
            self.save(environment, *claims.changed)
        return environment

    def record_planned(
        self,
        environment_id: UUID,
        attempt: int,
        project_path: str | None,
        inputs: Any,
        claimed_path: str | None,
        listening: tuple[int, ...] = (),
    ) -> Environment:
        """The host's plan for an environment placed while its host was away, with its claim taken
        and its block of ports leased (free of the `listening` ports the host found) in the same
        save; a path another environment holds, or no free block, fails the attempt for good instead.
        One claimed by a release before leases (no slug) leases none: its release promised none."""
        environment = self._changing_environment(environment_id)
        claims = self.claims.on_host(environment.host_id)
        ports = None
        if environment.may_plan(attempt):
            try:
                if claimed_path:
                    claims.take(claimed_path, environment.id)
                if environment.slug is not None:
                    _, ports = claims.choose_lease(None, self.ports, listening)
                    claims.lease(environment.id, environment.slug, ports)
            except PathAlreadyClaimed as refused:
                environment.record_create_failed(attempt, "terminal", f"cannot claim the workspace path: {refused}")
                self.save(environment)
                return environment
            except NoFreePorts as refused:
                environment.record_create_failed(attempt, "terminal", str(refused))
                self.save(environment)
                return environment
        if environment.record_planned(attempt, project_path, inputs, claimed_path, ports):
            self.save(environment, *claims.changed)
        return environment

    def note_host_awaited(self, environment_id: UUID, message: str) -> Environment:
        return self._change(environment_id, lambda e: e.note_host_awaited(message))[0]

    def record_create_failed(
        self, environment_id: UUID, attempt: int, failure: CreateFailure, message: str
    ) -> Environment:
        """A pool's member counts the failure in its pool, in the same save."""
        environment = self._changing_environment(environment_id)
        if environment.record_create_failed(attempt, failure, message):
            self.save(environment, *self._counted_by_pool(environment, False, message))
        return environment

    def start_setup(self, environment_id: UUID) -> tuple[Environment, bool]:
        return self._change(environment_id, lambda e: e.start_setup(e.setup_operation()))

    def skip_setup(self, environment_id: UUID, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.skip_setup(reason))[0]

    def record_setup_outcome(
        self, environment_id: UUID, operation_id: str, succeeded: bool, message: str | None
    ) -> Environment:
        """A pool's member counts the outcome in its pool, in the same save (its failure brake)."""
        environment = self._changing_environment(environment_id)
        if environment.record_setup_outcome(operation_id, succeeded, message):
            self.save(environment, *self._counted_by_pool(environment, succeeded, message))
        return environment

    def _counted_by_pool(self, environment: Environment, succeeded: bool, message: str | None) -> list[Pool]:
        if environment.pool_id is None or environment.bound:
            return []
        pool = self.find_pool(UUID(environment.pool_id), to_change=True)
        if pool is None or not pool.record_setup(
            environment.id, succeeded, message, self.pool_max_failures, datetime.now(UTC)
        ):
            return []
        return [pool]

    def record_bound(self, environment_id: UUID, resource: dict[str, Any] | None) -> Environment:
        return self._change(environment_id, lambda e: e.record_bound(resource))[0]

    def record_bind_failed(self, environment_id: UUID, message: str) -> Environment:
        """The member could not be given to its thread: it is removed, and the thread, its request
        still open, waits for the environment its placement gives it now (a cold one, as a rule)."""
        environment = self._changing_environment(environment_id)
        thread_id = environment.origin_thread_id
        if not environment.record_bind_failed(message):
            return environment
        thread = self._changing_thread(thread_id)
        if thread.environment_id == environment.id:
            thread.leave_environment()
            thread.request_environment()
        self.save(environment, thread)
        return environment

    def record_setup_skipped(self, environment_id: UUID, operation_id: str, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.record_setup_skipped(operation_id, reason))[0]

    def record_resource(self, environment_id: UUID, resource: dict[str, Any] | None) -> Environment:
        return self._change(environment_id, lambda e: e.record_resource(resource))[0]

    def record_paused(self, environment_id: UUID, resource: dict[str, Any] | None, now: datetime) -> Environment:
        return self._change(environment_id, lambda e: e.record_paused(resource, now))[0]

    def request_resume(self, environment_id: UUID) -> Environment:
        return self._change(environment_id, lambda e: e.request_resume())[0]

    def record_resumed(self, environment_id: UUID, resource: dict[str, Any] | None) -> Environment:
        return self._change(environment_id, lambda e: e.record_resumed(resource))[0]

    def retry(self, environment_id: UUID, path_key: str, claimed_path: str | None) -> Environment:
        """Retry a failed step; a new attempt on another path moves the claim in the same save."""
        environment = self._changing_environment(environment_id)
        previous_claim = environment.claimed_path
        environment.retry(path_key, claimed_path)
        claims = self.claims.on_host(environment.host_id)
        if environment.claimed_path != previous_claim:
            if environment.claimed_path:
                claims.take(environment.claimed_path, environment.id)
            if previous_claim:
                claims.release(previous_claim, environment.id)
        self.save(environment, *claims.changed)
        return environment

    def record_attempt_cleaned(self, environment_id: UUID, attempt: int) -> Environment:
        return self._change(environment_id, lambda e: e.record_attempt_cleaned(attempt))[0]

    def request_deletion(self, environment_id: UUID) -> Environment:
        return self._change(environment_id, lambda e: e.request_deletion())[0]

    def start_removal(self, environment_id: UUID, now: datetime) -> tuple[Environment, bool]:
        return self._change(environment_id, lambda e: e.start_removal(now) or e.retry_removal(now))

    def start_teardown(self, environment_id: UUID) -> tuple[Environment, bool]:
        return self._change(environment_id, lambda e: e.start_teardown(e.teardown_operation()))

    def skip_teardown(self, environment_id: UUID, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.skip_teardown(reason))[0]

    def record_teardown_outcome(
        self, environment_id: UUID, operation_id: str, outcome: str, message: str | None
    ) -> Environment:
        return self._change(environment_id, lambda e: e.record_teardown_outcome(operation_id, outcome, message))[0]

    def record_teardown_skipped(self, environment_id: UUID, operation_id: str, reason: str) -> Environment:
        return self._change(environment_id, lambda e: e.record_teardown_skipped(operation_id, reason))[0]

    def record_removed(
        self,
        environment_id: UUID,
        removal_attempt: int,
        saved_ref: str | None = None,
        not_saved: list[dict[str, Any]] | None = None,
    ) -> Environment:
        """Removal succeeded: the environment ends (with where its work was saved, and which files
        that save left out) and its path claims are released in the same save."""
        environment = self._changing_environment(environment_id)
        claimed = {p for p in (environment.claimed_path, environment.path) if p}
        if not environment.record_removed(removal_attempt, saved_ref, not_saved):
            return environment
        claims = self.claims.on_host(environment.host_id)
        for path in claimed:
            claims.release(path, environment.id)
        claims.end_lease(environment.id)
        self.save(environment, *claims.changed)
        return environment

    def record_remove_failed(
        self, environment_id: UUID, removal_attempt: int, message: str, retry_at: datetime
    ) -> Environment:
        return self._change(environment_id, lambda e: e.record_remove_failed(removal_attempt, message, retry_at))[0]

    def recorded_hook(self, operation_id: str) -> RecordedHook | None:
        """Whose hook the log started under this operation id, where, and whether it may run or be
        stopped now; None when the log never started one (whatever the id looks like)."""
        started = self._hooks.started(operation_id)
        if started is None:
            return None
        environment_id, kind = started
        return self.environment(environment_id).hook_record(operation_id, kind)

    def unfinished_environment_ids(self) -> list[UUID]:
        """Every environment whose log does not end in Removed: what recovery must drive on."""
        return self._live.ids()


def _take_recording_step(environment: Environment, empty: bool) -> None:
    """Take the aggregate's next step now if it only records (start or skip the setup): saved with
    the change that made it due, it costs no transaction, and no round of the driver, of its own.
    A crash finds the same state it would find after the driver had recorded the step.

    In an `empty` workspace the setup due is skipped: the host would find no script there, and
    asking it costs a hook record, a round trip and a save of their own. That decision is taken
    here, not by the aggregate's `next_step`, because `empty` is what the provider says of this
    one creation, not state the aggregate keeps."""
    match environment.next_step(datetime.now(UTC)):
        case StartSetup() if empty:
            environment.skip_setup(MADE_EMPTY_REASON)
        case StartSetup():
            environment.start_setup(environment.setup_operation())
        case SkipSetup(reason):
            environment.skip_setup(reason)
