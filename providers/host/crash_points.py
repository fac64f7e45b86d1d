"""Named places where the crash tests kill the service with SIGKILL.

`BB_CRASH_AT=<name>` makes the service kill itself the first time it reaches that place, so a
test can prove recovery from a crash between two particular steps, where an outside kill could
never aim; `BB_CRASH_AT=<name>#<n>` the n-th time (in the middle of a burst, say). Unset (always,
outside the tests), a crash point does nothing.
"""

from __future__ import annotations

import os
import signal

_TARGET, _, _NTH = os.environ.get("BB_CRASH_AT", "").partition("#")
_reached = 0


def crash_point(name: str) -> None:
    global _reached
    if name != _TARGET:
        return
    _reached += 1
    if _reached >= int(_NTH or 1):
        os.kill(os.getpid(), signal.SIGKILL)
