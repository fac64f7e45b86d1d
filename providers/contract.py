"""The environment-provider contract: what a provider declares and the calls the core makes.

A provider only creates and removes its resource. The core owns the lifecycle around it (claims,
hooks, retries, cancellation, retirement, recovery). Provider methods are plain synchronous
functions: the core runs them on worker threads, hands them a `Reporter` for progress and a
`threading.Event` that is set when the core wants the call to stop.

`ctx.raise_if_cancelled()` turns that event into the `Cancelled` exception, and `translate_errors`
turns it, and the exceptions a provider expects, into `CreateFailed` / `RemoveFailed`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeGuard, TypeVar, runtime_checkable

import msgspec

from bb_environments.domain.status import CreateFailure

T = TypeVar("T")


class Requires(msgspec.Struct, frozen=True, rename="camel"):
    """Facts a provider needs about the thread's project before it can serve it."""

    project_checkout: bool = False
    git_checkout: bool = False
    projectless: bool = False


class Policy(msgspec.Struct, frozen=True, rename="camel"):
    """How the core shares and retires this provider's environments.

    `path_keys` "per-thread" reuses one path key for every attempt of a thread's environment;
    "per-attempt" gives each attempt its own. `retire_grace_ms` None means never retire
    automatically. `children` "share" puts a child thread that names no environment of its own
    into its parent's environment; "own" gives it a fresh one from the same intent.
    """

    path_keys: Literal["per-thread", "per-attempt"] = "per-thread"
    retire_grace_ms: int | None = 300_000
    children: Literal["own", "share"] = "own"
    pool: bool = False
    """Whether a warm pool may keep this provider's environments ready ahead of their threads
    (SPEC 10): the provider then implements `PoolingProvider`'s methods too."""


def retire_grace_ms(policy: Policy | None, override: tuple[int | None] | None) -> int | None:
    """How long an environment without threads waits before it retires: its provider's grace
    (the default policy's when the provider is no longer installed), which `override`
    (BB_RETIRE_GRACE_MS) replaces, except for a provider that never retires."""
    grace = (policy or Policy()).retire_grace_ms
    if grace is None or override is None:
        return grace
    return override[0]


class Availability(msgspec.Struct, frozen=True):
    status: Literal["ready", "blocked"]
    reason: str | None = None


READY = Availability("ready")


class Created(msgspec.Struct, frozen=True, tag="created", tag_field="status", rename="camel"):
    """The resource exists at `path`. `owns_path` True lets the core run hooks and delete it.

    `empty` True says the provider made `path` just now and put nothing in it: no setup script
    can be there, so the core records the setup skipped with the creation, without asking the host."""

    path: str
    owns_path: bool = False
    merge_base_branch: str | None = None
    resource: dict[str, Any] | None = None
    empty: bool = False


class CreateFailed(msgspec.Struct, frozen=True, tag="failed", tag_field="status"):
    """`transient` failures are retried by the core after cleanup; `terminal` ones are final."""

    failure: CreateFailure
    message: str


class NotSavedFile(msgspec.Struct, frozen=True):
    """A file of the workspace its saved work left out, being larger than BB_SAVED_WORK_MAX_BYTES
    (providers/saved_work.py): deleted with the workspace."""

    path: str
    """Relative to the workspace."""
    bytes: int


class Removed(msgspec.Struct, frozen=True, tag="removed", tag_field="status"):
    """`saved_ref` names where the work that existed only in the workspace was saved before it
    was deleted (a git ref in the project repository), or None when nothing needed saving;
    `not_saved`, the largest of the files that save left out (deleted with the workspace)."""

    saved_ref: str | None = None
    not_saved: list[NotSavedFile] = []


class RemoveFailed(msgspec.Struct, frozen=True, tag="failed", tag_field="status"):
    message: str


CreateResult = Created | CreateFailed
RemoveResult = Removed | RemoveFailed


class InvalidInputs(ValueError):
    """Raised by `validate` for input the provider refuses; the message names field and rule."""


class PlanRefused(Exception):
    """The provider cannot create here now (its availability says why); the request was valid."""


class ProviderMissing(Exception):
    """The environment's provider is not registered now; its cleanup waits for it to return."""


class HostUnavailable(Exception):
    """No agent answers for the host (or it refused): the step waits and is asked again later.

    What a host reached over a network raises, and a hook request the log does not back yet (the
    agent's ledger may not have caught up with it); the provisioning driver waits on it without
    knowing how the work travels."""


class Cancelled(Exception):
    """The core asked the call to stop (`ctx.raise_if_cancelled()`); reported as "cancelled"."""

    def __init__(self) -> None:
        super().__init__("cancelled")


class Reporter(Protocol):
    def step(self, text: str) -> None:
        """A new step started (becomes the transcript's current step)."""

    def log(self, text: str) -> None:
        """Output belonging to the current step."""


class Transcript(Protocol):
    """An environment's transcript, where the core's steps and a provider's reports are written
    (from any thread)."""

    def line(
        self,
        environment_id: str,
        kind: Literal["step", "output"],
        source: str,
        text: str,
        message_id: str | None = None,
    ) -> None:
        """`message_id` names a line that may be written again: it is kept once."""
        ...


class SilentReporter:
    def step(self, text: str) -> None:
        pass

    def log(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class ProjectContext:
    """What every decision callback learns about the request."""

    host_id: str
    project_path: str | None
    inputs: Any
    data_dir: str
    """A directory that belongs to this provider alone (created by the core)."""


def inputs_as(ctx: ProjectContext, inputs_type: type[T]) -> T:
    """The context's inputs, which the core has already converted to the provider's `inputs_type`."""
    if not isinstance(ctx.inputs, inputs_type):
        raise TypeError(f"expected {inputs_type.__name__}, got {type(ctx.inputs).__name__}")
    return ctx.inputs


class Previous(msgspec.Struct, frozen=True):
    """The attempt before this one, so a re-asked create can finish or clean what it left."""

    attempt: int
    path: str | None
    resource: dict[str, Any] | None


class _Cancellable:
    cancelled: threading.Event

    def raise_if_cancelled(self) -> None:
        """Raise `Cancelled` when the core has set `cancelled`: call it between steps."""
        if self.cancelled.is_set():
            raise Cancelled()


@dataclass(frozen=True)
class CreateContext(ProjectContext, _Cancellable):
    thread_id: str = ""
    path_key: str = ""
    attempt: int = 1
    previous: Previous | None = None
    environment_id: str = ""
    """The environment this attempt creates for: a key for what the host keeps of the call."""
    report: Reporter = field(default_factory=SilentReporter)
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class RemoveContext(_Cancellable):
    host_id: str
    data_dir: str
    project_path: str | None
    inputs: Any
    path: str | None
    """None when create never returned a path: remove everything under `path_key`."""
    path_key: str
    attempt: int
    """The create attempt whose resource is removed; retries of a removal keep it."""
    resource: dict[str, Any] | None
    environment_id: str = ""
    """The environment whose resource is removed: a key for what the host keeps of the call."""
    report: Reporter = field(default_factory=SilentReporter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    unbound_member: bool = False
    """A warm pool's member that no thread ever took (stale, failed or beyond its pool's size):
    nothing in it is anyone's work, so nothing is saved, and what `create` named for the member
    alone (git-worktree: its branch) goes with it."""


class Failure:
    """What `translate_errors` caught, as the result `create` or `remove` returns for it."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def create_failed(self) -> CreateFailed:
        """`Cancelled` is a terminal "cancelled"; an error whose `transient` attribute is true is transient."""
        error = self._caught()
        return CreateFailed("transient" if getattr(error, "transient", False) else "terminal", str(error))

    def remove_failed(self) -> RemoveFailed:
        return RemoveFailed(str(self._caught()))

    def _caught(self) -> Exception:
        if self.error is None:
            raise RuntimeError("the translate_errors block ended without returning a result")
        return self.error


@contextmanager
def translate_errors(*expected: type[Exception]) -> Iterator[Failure]:
    """Catch `Cancelled` and the `expected` exceptions raised in the block, for a failed result.

    The block returns the result; when it raises one of those instead, the code after the block
    returns the failure:

        with translate_errors(OSError, ValueError) as failed:
            ctx.raise_if_cancelled()
            ...
            return Created(path)
        return failed.create_failed()

    Any other exception propagates (the core records it as a terminal failure of the provider).
    """
    failure = Failure()
    caught: tuple[type[Exception], ...] = (Cancelled, *expected)
    try:
        yield failure
    except caught as error:
        failure.error = error


@runtime_checkable
class EnvironmentProvider(Protocol):
    id: str
    display_name: str
    requires: Requires
    policy: Policy
    inputs_type: type | None
    """A msgspec-convertible type for the inputs (its JSON Schema is published), or None."""

    def availability(self, ctx: ProjectContext) -> Availability:
        """Whether the provider can create here now, and if not why. Must not change anything."""

    def validate(self, ctx: ProjectContext) -> None:
        """Refuse bad input by raising InvalidInputs. Must not change anything."""

    def planned_path(self, ctx: ProjectContext, path_key: str) -> str | None:
        """The path create will touch, so the core can claim it first; None if not knowable.
        Must not change anything: a spawn sent again places its thread again, and drops the answer."""

    def create(self, ctx: CreateContext) -> CreateResult: ...

    def remove(self, ctx: RemoveContext) -> RemoveResult: ...


class PausableProvider(EnvironmentProvider, Protocol):
    """Optional: a provider that suspends an idle environment's resource and brings it back (the
    core's idle tracking calls these; see `is_pausable`)."""

    def idle_pause_due(self, last_activity: datetime, now: datetime, data_dir: str) -> bool: ...

    def pause(self, resource: dict[str, Any], checkpoint: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Suspend; `checkpoint` gets the resumable resource before anything is stopped."""
        ...

    def resume(self, resource: dict[str, Any]) -> dict[str, Any]: ...


def runs_in_the_cloud(provider: EnvironmentProvider) -> bool:
    """Optional `in_the_cloud = True`: the provider's resources live in no host's filesystem, so
    the core calls it itself instead of a host's agent (Modal)."""
    return getattr(provider, "in_the_cloud", False) is True


class BaseHead(msgspec.Struct, frozen=True, rename="camel"):
    """What a pool's member prepared now would be prepared on: the base's head commit and the
    sha256 of the setup script (`.bb-env-setup.sh`) at that commit, None when it has none."""

    base_commit: str
    setup_hash: str | None


class BaseUnknown(Exception):
    """`base_head` cannot read the base's head now (its remote out of reach, say): a thread's
    placement then binds no member (it gets a cold environment) and the pool prepares none."""


class BindFailed(Exception):
    """`bind` could not give the member's workspace to the thread; nothing was changed."""


@dataclass(frozen=True)
class BindContext(ProjectContext):
    """A pool's member bound to a thread: `inputs` are the thread's, `path_key` the thread's path
    key (what a workspace of its own would be keyed by), `path` and `resource` the member's."""

    path: str = ""
    resource: dict[str, Any] | None = None
    path_key: str = ""


class PoolingProvider(EnvironmentProvider, Protocol):
    """Optional, with `policy.pool`: a provider whose environments a warm pool prepares ahead
    (SPEC 10, docs/providers.md). Each method runs on the environment's host."""

    def base_head(self, ctx: ProjectContext) -> BaseHead:
        """Where a member for these inputs would be prepared now. Must not change anything.
        Raises BaseUnknown when that cannot be read now."""
        ...

    def member_inputs(self, ctx: ProjectContext, path_key: str) -> Any:
        """The inputs (of `inputs_type`) a member prepared under `path_key` is created with: the
        request's, with whatever names the thread's own identity (a new branch's name) replaced by
        one of the member's; raises InvalidInputs for inputs no pool can serve."""
        ...

    def bind(self, ctx: BindContext) -> dict[str, Any] | None:
        """Give the member's workspace the thread's identity (git-worktree: rename its branch to
        the thread's); return its resource as it is now. Safe to call again after a crash: one
        already given to the thread returns at once. Raises BindFailed with why, having changed
        nothing."""
        ...


def can_pool(provider: EnvironmentProvider) -> TypeGuard[PoolingProvider]:
    return provider.policy.pool and all(hasattr(provider, method) for method in ("base_head", "member_inputs", "bind"))


def is_pausable(provider: EnvironmentProvider) -> TypeGuard[PausableProvider]:
    return all(hasattr(provider, method) for method in ("idle_pause_due", "pause", "resume"))


class Leftover(msgspec.Struct, frozen=True):
    """Something bb's layout made on a host: a `workspace` directory under a provider's root, a
    git `worktree` of that layout registered in `repo`, or a `branch` (`bb/...`) in `repo`.

    `path` is canonical; a branch's is `<repo>:<branch>`. `path_key` is the key directory it
    lies under (for a branch: that of the worktree of the layout it is checked out in), if any."""

    provider_id: str
    kind: Literal["workspace", "worktree", "branch"]
    path: str
    repo: str | None = None
    branch: str | None = None
    path_key: str | None = None


@runtime_checkable
class SurveyedProvider(EnvironmentProvider, Protocol):
    """Optional: a provider whose workspaces are directories of bb's layout on the host, which
    `bb doctor` lists and whose leftovers it removes (see `is_surveyed`)."""

    def leftovers(self, data_dir: str, repos: list[str]) -> list[Leftover]:
        """What exists under the provider's root and, of bb's layout, in `repos`."""
        ...

    def remove_leftover(self, data_dir: str, leftover: Leftover) -> str | None:
        """Save the leftover's work, then remove it; the ref the work was saved as, if any.
        Raises when it could not be saved (then nothing is removed)."""
        ...


def is_surveyed(provider: EnvironmentProvider) -> TypeGuard[SurveyedProvider]:
    return all(hasattr(provider, method) for method in ("leftovers", "remove_leftover"))


def shares_planned_path(provider: EnvironmentProvider, ctx: ProjectContext) -> bool:
    """Whether a thread asking for `ctx` joins a live environment of this provider that already
    holds the planned path, instead of being refused for the conflict.

    Optional for providers (`shares_planned_path(ctx) -> bool`); without it, never. Meant for a
    path used as it is, which a second create would not change (a checkout on its current branch).
    """
    decide = getattr(provider, "shares_planned_path", None)
    return bool(decide(ctx)) if decide is not None else False
