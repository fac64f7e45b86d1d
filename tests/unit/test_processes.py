"""One rule for "does this process still run" (providers/host/processes.py): a zombie has ended,
whether the CLI asks about the service, a provider waits for the processes it killed, or a hook
runner asks about a supervisor."""

import os
import signal
import subprocess
import sys
import time

from bb_environments.providers.host.processes import (
    is_same_process,
    kill_and_wait,
    pid_alive,
    process_start_ticks,
    start_ticks_of_child,
)

DEADLINE_S = 10.0


def test_a_child_that_exited_unreaped_is_not_alive_by_any_of_the_checks() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started_at = start_ticks_of_child(child.pid)
        assert pid_alive(child.pid) and is_same_process(child.pid, started_at)

        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE_S
        while pid_alive(child.pid):  # a zombie from the moment it died: no reaping happens here
            assert time.monotonic() < deadline, "the killed child still counts as alive"
            time.sleep(0.01)

        assert start_ticks_of_child(child.pid) == started_at  # still there, unreaped
        assert process_start_ticks(child.pid) is None and not is_same_process(child.pid, started_at)
        assert kill_and_wait([child.pid], timeout=DEADLINE_S)  # nothing left to wait for
    finally:
        child.kill()
        child.wait()
