"""Keeping every process an environment's hooks start within reach, so its removal can end them all.

A hook may leave processes behind on purpose (a setup's dev server runs while the environment is
live), and those may move to another session, process group or working directory, or fork twice
to lose their parent: none of that may let them outlive the environment (SPEC 9). So each process
a hook supervisor starts is put in a place it cannot leave, keyed by the environment's id, and the
removal of the environment ends everything in that place before its provider removes the
workspace (providers/workspaces.py).

- `CgroupContainment`, where a cgroup v2 hierarchy is writable and has `cgroup.kill`: one cgroup
  per environment. The supervisor moves itself into it before it starts the script, so every
  descendant is born inside; only a process allowed to write another cgroup's `cgroup.procs` can
  leave (the agent's own user can, a BB_WORKSPACE_USER cannot). Which cgroup an environment has is
  written down (in a state directory of the agent's) before the cgroup is made, so a removal after
  a crash, from a process in another cgroup, finds it.
- `MarkerContainment`, otherwise: every hook's environment carries BB_ENVIRONMENT_ID, and removal
  kills every process whose initial environment (/proc/<pid>/environ) has it. A process that
  executes a program with an environment of its own making is not found.

`host_containment` chooses one per state directory and says in one log line which, and what it
cannot contain. Standard library only: the supervisor, run without site-packages, imports
`enter_cgroup`.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Protocol

from bb_environments.providers.host.processes import kill_and_wait

MARKER = "BB_ENVIRONMENT_ID"
"""The variable naming its environment in every hook's environment."""
CGROUP_ROOT_NAME = "bb-environments"
EMPTY_WAIT_S = 4.0
EMPTY_POLL_S = 0.01
MARKER_SWEEPS = 20
"""How often removal looks again for marked processes: a fork between a look and its kill adds one."""


class Containment(Protocol):
    description: str
    """One sentence for the log: the mechanism, and what it cannot contain."""

    def prepare(self, environment_id: str) -> str | None:
        """Where a hook of the environment is to run (a cgroup directory), made ready; None: anywhere."""
        ...

    def end(self, environment_id: str) -> bool:
        """End every process the environment's hooks left; True once none is left. Blocking."""
        ...


def enter_cgroup(cgroup: str) -> None:
    """Move the calling process into `cgroup`, where its children are then born."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
        procs.write("0")


class CgroupContainment:
    def __init__(self, root: Path, state_dir: Path) -> None:
        self._root = root
        self._state_dir = state_dir
        self.description = (
            f"hook processes are contained in a cgroup v2 per environment under {root}: "
            "only a process allowed to write to that hierarchy (a hook run as the agent's own user, "
            "without BB_WORKSPACE_USER) could move itself out")

    def prepare(self, environment_id: str) -> str:
        cgroup = self._root / f"env-{environment_id}"
        noted = self._note(environment_id)
        if not noted.exists():
            _write_atomically(noted, str(cgroup))
        os.makedirs(cgroup, exist_ok=True)
        return str(cgroup)

    def end(self, environment_id: str) -> bool:
        noted = self._note(environment_id)
        try:
            cgroup = Path(noted.read_text())
        except FileNotFoundError:
            return True  # no hook of it ever ran here
        if cgroup.exists():
            try:
                (cgroup / "cgroup.kill").write_text("1")
            except FileNotFoundError:
                pass  # removed meanwhile
            if not _emptied(cgroup):
                return False
            try:
                cgroup.rmdir()
            except FileNotFoundError:
                pass
        noted.unlink(missing_ok=True)
        return True

    def _note(self, environment_id: str) -> Path:
        return self._state_dir / environment_id


class MarkerContainment:
    def __init__(self, reason: str) -> None:
        self.description = (
            f"hook processes are found by the {MARKER} in their environment ({reason}): a process "
            "that runs a program with an environment of its own making is not contained")

    def prepare(self, environment_id: str) -> None:
        return None

    def end(self, environment_id: str) -> bool:
        marker = f"{MARKER}={environment_id}".encode()
        for _ in range(MARKER_SWEEPS):
            marked = _processes_marked(marker)
            if not marked:
                return True
            if not kill_and_wait(marked):
                return False
        return not _processes_marked(marker)


@functools.cache
def host_containment(state_dir: Path) -> Containment:
    """The containment of this host's hooks, keeping its state in `state_dir`, chosen once per
    process and said in one log line."""
    import logging

    containment = _choose(state_dir)
    logging.getLogger(__name__).info("%s", containment.description)
    return containment


def cgroup_root() -> Path | None:
    """Where this process's environments' cgroups are made (None: no cgroup v2 hierarchy)."""
    unified = _unified_mount()
    return None if unified is None else Path(unified + _own_cgroup()) / CGROUP_ROOT_NAME


def _choose(state_dir: Path) -> Containment:
    unified = _unified_mount()
    root = cgroup_root()
    if unified is None or root is None:
        return MarkerContainment("no cgroup v2 hierarchy is mounted")
    try:
        root.mkdir(exist_ok=True)
        writable = os.access(root / "cgroup.procs", os.W_OK)
    except OSError as error:
        return MarkerContainment(f"the cgroup v2 hierarchy at {unified} is not writable: {error.strerror}")
    if not writable:
        return MarkerContainment(f"the cgroup v2 hierarchy at {unified} is not writable")
    if not (root / "cgroup.kill").exists():
        return MarkerContainment("this kernel's cgroup v2 has no cgroup.kill")
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return CgroupContainment(root, state_dir)


def _unified_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (its root), if it is."""
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()
                separator = fields.index("-")
                # The mount's root within the hierarchy (field 4) must be the hierarchy's own.
                if fields[separator + 1] == "cgroup2" and fields[3] == "/":
                    return fields[4]
    except OSError:
        pass
    return None


def _own_cgroup() -> str:
    """This process's cgroup v2 path ("0::/path"), "" for the root."""
    with open("/proc/self/cgroup") as cgroups:
        for line in cgroups:
            if line.startswith("0::"):
                return line[3:].strip().rstrip("/")
    return ""


def _emptied(cgroup: Path) -> bool:
    deadline = time.monotonic() + EMPTY_WAIT_S
    while True:
        try:
            events = (cgroup / "cgroup.events").read_text()
        except FileNotFoundError:
            return True
        if "populated 0" in events:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(EMPTY_POLL_S)


def _processes_marked(marker: bytes) -> list[int]:
    own = os.getpid()
    marked = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
        except OSError:
            continue
        if marker in variables:
            marked.append(int(entry.name))
    return marked


def _write_atomically(path: Path, text: str) -> None:
    """Written whole and durable before the cgroup it names exists: a crash leaves it or nothing."""
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, text.encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
