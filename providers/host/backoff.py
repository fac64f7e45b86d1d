"""Retrying what the host refuses for now (a full disk, say) without a traceback per attempt.

Whoever retries an operation asks `failed(error)` how long to wait before the next attempt (the
delay doubles up to a cap) and calls `succeeded()` once an attempt went through. The log gets one
line when the failures start and one when they end, however many attempts lie between: a full
disk otherwise buries the log under a traceback per attempt, several a second.
"""

from __future__ import annotations

import logging
import time

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0


class Backoff:
    def __init__(
        self, log: logging.Logger | None, what: str, first_s: float = FIRST_DELAY_S, max_s: float = MAX_DELAY_S
    ) -> None:
        """`what` names the operation in the log, as in "<what> failed (...)". Without a `log` the
        caller reports the failures itself (the bus's outages are reported once, for every caller)."""
        self._log = log
        self._what = what
        self._first_s = first_s
        self._max_s = max_s
        self._delay_s = 0.0
        self._failures = 0
        self._failing_since = 0.0

    def failed(self, error: BaseException) -> float:
        """The seconds to wait before the next attempt."""
        if self._failures == 0:
            self._failing_since = time.monotonic()
            self._delay_s = self._first_s
            if self._log is not None:
                self._log.warning(
                    "%s failed (%s: %s); retrying with backoff until it succeeds",
                    self._what,
                    type(error).__name__,
                    error,
                )
                # Not a disk at all but a bug, perhaps: its traceback, for whoever runs with DEBUG.
                self._log.debug("%s failed", self._what, exc_info=error)
        else:
            self._delay_s = min(2 * self._delay_s, self._max_s)
        self._failures += 1
        return self._delay_s

    def succeeded(self) -> None:
        if self._failures:
            if self._log is not None:
                self._log.info(
                    "%s succeeded after %d failed attempts over %.1f s",
                    self._what,
                    self._failures,
                    time.monotonic() - self._failing_since,
                )
            self._failures = 0
