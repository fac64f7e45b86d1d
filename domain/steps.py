"""What an environment needs done next, as its aggregate decides it (`Environment.next_step`).

Each step is a small value naming one thing for the provisioning driver to do: record a command,
start a long task (a provider call, a hook on the environment's host) or set a timer. Which step
comes next depends only on the recorded state and the time, so the same answer serves a fresh
event, a redelivered one, the periodic sweep and recovery after a crash. The driver executes a
step; it never decides one.

A `Run…` step is the long work of a step already recorded (a claimed attempt, a started hook, a
started removal): the driver runs it at most once per process and records its outcome, which
yields the next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class RunCreate:
    """Ask the provider to create the workspace of this attempt (again, after a crash)."""

    attempt: int


@dataclass(frozen=True)
class StopCreate:
    """Cancelled while creating: stop the create in flight, and start removal once none runs
    (removal must not race a create that may still write under the path key)."""

    attempt: int


@dataclass(frozen=True)
class StartSetup:
    """Record SetupStarted: the environment's host runs `.bb-env-setup.sh`, or answers that there
    is none (where the workspace is; only a provider that has just made the workspace empty can
    tell sooner, see Environments.record_created)."""


@dataclass(frozen=True)
class SkipSetup:
    """Record SetupSkipped and Ready: there is no setup to run here."""

    reason: str


@dataclass(frozen=True)
class BindMember:
    """A pool's member was bound to a thread: ask its provider to rename the workspace for the
    thread (its branch), and record it ready (or, when that fails, the thread's leaving)."""


@dataclass(frozen=True)
class RunSetup:
    """Run (or join) the recorded setup hook on the host and record its outcome."""

    operation_id: str


@dataclass(frozen=True)
class CancelSetup:
    """Cancelled while its setup runs: ask the host to stop the hook, and still record the
    outcome (the log waits for it before anything is removed)."""

    operation_id: str


@dataclass(frozen=True)
class StartRemoval:
    """Record RemovalStarted: cancelled, deleted, or the retire deadline passed."""


@dataclass(frozen=True)
class CleanAttempt:
    """A failed create may have left something under its path key: remove it, then record
    AttemptCleaned (before any retry)."""

    attempt: int


@dataclass(frozen=True)
class RetryTransient:
    """A transient create failure, cleaned up and waited out: record the next attempt."""

    failed_attempt: int


@dataclass(frozen=True)
class WakeAt:
    """Nothing to do before `when` (a retire deadline, a retry's): look again then."""

    when: datetime


@dataclass(frozen=True)
class PauseWhenIdle:
    """Ready and not retiring: a provider that can suspend its resource pauses it once it has been
    idle long enough, counted from the last activity seen, else from `quiet_since` (the last event)."""

    quiet_since: datetime


@dataclass(frozen=True)
class Resume:
    """Paused, and a thread's message asked for the resume in the log: resume the resource."""


@dataclass(frozen=True)
class ResumeOnActivity:
    """Paused: resume the resource when a thread is active again after `paused_at` (the moment
    the environment was judged idle, before the pause ran)."""

    paused_at: datetime


@dataclass(frozen=True)
class StartTeardown:
    """Record TeardownStarted: the host runs `.bb-env-teardown.sh`, or answers that there is none."""


@dataclass(frozen=True)
class SkipTeardown:
    """Record TeardownSkipped: there is no teardown to run here."""

    reason: str


@dataclass(frozen=True)
class RunTeardown:
    """Run (or join) the recorded teardown hook on the host and record its outcome."""

    operation_id: str


@dataclass(frozen=True)
class Remove:
    """Ask the provider to remove the workspace in this removal attempt, and record the answer."""

    removal_attempt: int


@dataclass(frozen=True)
class RetryRemoval:
    """A failed removal's retry is due: record the next removal attempt."""

    failed_attempt: int


@dataclass(frozen=True)
class Settled:
    """Nothing to do until a command changes the state (a thread, a retry, a deletion)."""


Step = (
    RunCreate
    | StopCreate
    | StartSetup
    | SkipSetup
    | BindMember
    | RunSetup
    | CancelSetup
    | StartRemoval
    | CleanAttempt
    | RetryTransient
    | WakeAt
    | PauseWhenIdle
    | Resume
    | ResumeOnActivity
    | StartTeardown
    | SkipTeardown
    | RunTeardown
    | Remove
    | RetryRemoval
    | Settled
)
