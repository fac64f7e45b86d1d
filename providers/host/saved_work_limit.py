"""BB_SAVED_WORK_MAX_BYTES, read where a save runs (providers/saved_work.py) and checked at start
(entrypoints/config.py): the standard library only, so a `bb` command that loads the settings
loads nothing of git's.
"""

import os

SAVED_WORK_MAX_BYTES = 10 << 20
"""Far above a source file, a lock file or a small fixture; below the build outputs, dumps, archives
and databases that would make the project's `.git` grow for good."""


def saved_work_max_bytes() -> int:
    """BB_SAVED_WORK_MAX_BYTES: the largest file a save keeps; ValueError naming what is allowed otherwise."""
    raw = os.environ.get("BB_SAVED_WORK_MAX_BYTES")
    if not raw:
        return SAVED_WORK_MAX_BYTES
    if raw.isascii() and raw.isdigit() and int(raw) > 0:
        return int(raw)
    raise ValueError(f"BB_SAVED_WORK_MAX_BYTES {raw!r} is not allowed: use a number of bytes greater than 0")
