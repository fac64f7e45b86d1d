"""Whether a process still runs: asked by every `bb` command that waits on the service, so it
imports nothing beyond `os` (the embedded server's module, where it lived, loads subprocess and
more)."""

import os


def pid_alive(pid: int) -> bool:
    """Whether a process runs as `pid`. A zombie does not: it has ended and will never answer,
    though its parent has not reaped it yet (a test's, say, or a supervisor's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read()
    except OSError:
        return True  # without /proc, the signal's answer stands
    return fields.rpartition(")")[2].split()[:1] != ["Z"]
