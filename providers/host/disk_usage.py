"""How much disk a workspace takes, counted as `du -sb` counts it: the apparent size (st_size) of
every file, directory and symlink under it, a file with several hard links once.

The walk never follows a symlink (lstat, and `is_dir(follow_symlinks=False)`) and never enters
another filesystem mounted below the workspace (a bind mount of a cache, a tmpfs): what counts is
what this workspace put on its own disk. A worktree's `.git` is a file naming the project's
repository, counted as the small file it is: the repository every worktree of the project shares
is never walked. Called on a worker thread (it reads every inode of the tree); it lets the
interpreter run others every few hundred entries, so a large tree does not hold the core's loop.

Standard library only.
"""

from __future__ import annotations

import os
import stat
import time

YIELD_EVERY = 512
"""Entries read between two pauses that hand the interpreter to other threads."""


def tree_bytes(root: str) -> int | None:
    """The bytes under `root`, or None when it is not a directory now (gone, or a symlink)."""
    try:
        top = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return None
    total = top.st_size
    linked: set[tuple[int, int]] = set()
    pending = [root]
    read = 0
    while pending:
        directory = pending.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue  # removed meanwhile, or unreadable: what is left is still counted
        with entries:
            for entry in entries:
                read += 1
                if read % YIELD_EVERY == 0:
                    time.sleep(0)
                try:
                    found = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if found.st_dev != top.st_dev:
                    continue  # another filesystem mounted here
                if found.st_nlink > 1 and not stat.S_ISDIR(found.st_mode):
                    if (found.st_dev, found.st_ino) in linked:
                        continue
                    linked.add((found.st_dev, found.st_ino))
                total += found.st_size
                if stat.S_ISDIR(found.st_mode):
                    pending.append(entry.path)
    return total
