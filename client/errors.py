"""What the typed client raises: each error names what went wrong in one sentence."""

from __future__ import annotations

from bb_environments.bus.wire.placements import PlacementOutcome


class ClientError(Exception):
    """Anything the client reports."""


class ServiceNotFound(ClientError):
    """No service to connect to: no server.json in the data dir, or its server refused or did not answer."""


class InvalidId(ClientError, ValueError):
    """A thread or host id the service does not allow (SPEC's rule, named in the message); nothing was sent."""


class ServiceUnavailable(ClientError):
    """The service took no message within the time allowed: it is down or restarting for longer,
    or the connection is closed. Whatever was sent again meanwhile is taken once, if it was taken."""


class PlacementTimedOut(ClientError, TimeoutError):
    """`wait_ready` heard no placement outcome within its timeout; the thread may still be placed."""


class PlacementFailed(ClientError):
    """A thread's placement outcome was not `ready`; `outcome` is the outcome itself."""

    def __init__(self, outcome: PlacementOutcome) -> None:
        self.outcome = outcome
        if outcome.status == "refused":
            said = f"thread {outcome.thread_id} was refused: {outcome.reason}"
        else:
            said = f"the environment {outcome.environment_id} of thread {outcome.thread_id} failed: {outcome.reason}"
        super().__init__(said)


class PlacementRefused(PlacementFailed):
    """The thread's event was refused (validation, an unknown provider or thread, a claimed path...)."""


class EnvironmentFailed(PlacementFailed):
    """The thread's environment failed for good (its create or its setup)."""
