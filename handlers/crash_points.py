"""Named places where the crash tests kill the service with SIGKILL.

`BB_CRASH_AT=<name>` makes the service kill itself the first time it reaches that place, so a
test can prove recovery from a crash between two particular steps, where an outside kill could
never aim. Unset (always, outside the tests), a crash point does nothing.
"""

from __future__ import annotations

import os
import signal

_TARGET = os.environ.get("BB_CRASH_AT")


def crash_point(name: str) -> None:
    if name == _TARGET:
        os.kill(os.getpid(), signal.SIGKILL)
