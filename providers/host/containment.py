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

Where cgroups are writable, they also bound what an environment's hooks, and what those leave
running, may use together (`Limits`: pids.max and memory.max, BB_MAX_PIDS_PER_ENVIRONMENT and
BB_MAX_MEMORY_PER_ENVIRONMENT), so that one tenant's setup cannot take the host's processes or
memory from the others. A controller the unified hierarchy does not offer is taken from a v1
hierarchy of its own where one is mounted and writable (a hybrid host); the supervisor enters the
environment's cgroup in each hierarchy. When a hook fails, `limits_hit` says which limit it ran
into, from the controllers' own event counts.

`host_containment` chooses one per state directory and says in one log line which, what it
cannot contain and what it limits. Standard library only: the supervisor, run without
site-packages, imports `enter_cgroup` and `limits_hit`.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bb_environments.providers.host.durable_files import write_durably
from bb_environments.providers.host.processes import kill_and_wait

MARKER = "BB_ENVIRONMENT_ID"
"""The variable naming its environment in every hook's environment."""
CGROUP_ROOT_NAME = "bb-environments"
EMPTY_WAIT_S = 4.0
EMPTY_POLL_S = 0.01
MARKER_SWEEPS = 20
"""How often removal looks again for marked processes: a fork between a look and its kill adds one."""


@dataclass(frozen=True)
class Limits:
    """What one environment's processes may use together, where a cgroup can hold them to it."""

    pids: int
    """BB_MAX_PIDS_PER_ENVIRONMENT: processes and threads at once (pids.max)."""
    memory_bytes: int
    """BB_MAX_MEMORY_PER_ENVIRONMENT: memory in use, page cache included, swap not (memory.max)."""


@dataclass(frozen=True)
class _Controller:
    """One limit, as each cgroup version spells its files."""

    name: str
    setting: str
    limit_files: tuple[str, str]
    """Where the limit is set: on the unified hierarchy, on a v1 one."""
    event_files: tuple[tuple[str, str], tuple[str, str]]
    """Which count (file, key) grows when the limit is hit, likewise: for pids, a fork refused;
    for memory, a process the kernel killed because the cgroup was out of memory."""

    def limit_of(self, limits: Limits) -> int:
        return limits.pids if self.name == "pids" else limits.memory_bytes

    def described(self, value: int) -> str:
        return f"{self.setting} ({value} processes)" if self.name == "pids" else f"{self.setting} ({_size(value)})"


CONTROLLERS = (
    _Controller(
        "pids",
        "BB_MAX_PIDS_PER_ENVIRONMENT",
        ("pids.max", "pids.max"),
        (("pids.events", "max"), ("pids.events", "max")),
    ),
    _Controller(
        "memory",
        "BB_MAX_MEMORY_PER_ENVIRONMENT",
        ("memory.max", "memory.limit_in_bytes"),
        (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")),
    ),
)


class Containment(Protocol):
    description: str
    """One sentence for the log: the mechanism, what it cannot contain and what it limits."""

    def prepare(self, environment_id: str) -> list[str]:
        """The cgroup directories a hook of the environment is to run in, made ready (limits
        set); none: anywhere."""
        ...

    def end(self, environment_id: str) -> bool:
        """End every process the environment's hooks left; True once none is left. Blocking."""
        ...


def enter_cgroup(cgroup: str) -> None:
    """Move the calling process into `cgroup`, where its children are then born."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
        procs.write("0")


def limit_counts(cgroups: Iterable[str]) -> dict[str, int]:
    """How often each limit of `cgroups` has been hit so far, by controller name."""
    counts = {}
    for cgroup in cgroups:
        for controller in CONTROLLERS:
            for events, key in controller.event_files:
                count = _count_in(os.path.join(cgroup, events), key)
                if count is not None:
                    counts[controller.name] = count
                    break
    return counts


def limits_hit(cgroups: Sequence[str], before: dict[str, int]) -> list[str]:
    """The limits of `cgroups` hit since `before` (limit_counts), each named by its setting and value."""
    hit = []
    for name, count in limit_counts(cgroups).items():
        if count > before.get(name, 0):
            controller = next(controller for controller in CONTROLLERS if controller.name == name)
            value = _limit_value(cgroups, controller)
            hit.append(controller.setting if value is None else controller.described(value))
    return hit


class CgroupContainment:
    def __init__(self, root: Path, state_dir: Path, limits: Limits, limited: dict[str, Path]) -> None:
        """`limited`: the controllers that hold `limits`, by name, each with the root of the
        environments' cgroups in the hierarchy that offers it (`root` itself, or a v1 one)."""
        self._root = root
        self._state_dir = state_dir
        self._limits = limits
        self._limited = limited
        held = [
            f"{controller.described(controller.limit_of(limits))} in {limited[controller.name]}"
            for controller in CONTROLLERS
            if controller.name in limited
        ]
        unheld = [controller for controller in CONTROLLERS if controller.name not in limited]
        self.description = (
            f"hook processes are contained in a cgroup v2 per environment under {root}: "
            "only a process allowed to write to that hierarchy (a hook run as the agent's own user, "
            "without BB_WORKSPACE_USER) could move itself out"
            + (f"; each environment is held to {' and '.join(held)}" if held else "")
            + (
                f"; {' and '.join(c.setting for c in unheld)} cannot be held here: no writable cgroup "
                f"offers the {' or '.join(c.name for c in unheld)} controller"
                if unheld
                else ""
            )
        )

    def prepare(self, environment_id: str) -> list[str]:
        name = f"env-{environment_id}"
        cgroups = [
            self._root / name,
            *(root / name for root in dict.fromkeys(self._limited.values()) if root != self._root),
        ]
        noted = self._note(environment_id)
        # Noted before any is made, so that a removal after a crash finds every one of them.
        if _noted_cgroups(noted) != cgroups:
            write_durably(noted, "\n".join(map(str, cgroups)).encode())
        for cgroup in cgroups:
            os.makedirs(cgroup, exist_ok=True)
        for controller in CONTROLLERS:
            if controller.name in self._limited:
                self._set_limit(self._limited[controller.name] / name, controller)
        return [str(cgroup) for cgroup in cgroups]

    def _set_limit(self, cgroup: Path, controller: _Controller) -> None:
        """Set for every hook, so that a changed setting holds from the next one on. A limit the
        kernel refuses now (memory below what is in use, on a v1 hierarchy) stays as it was."""
        for file in controller.limit_files:  # the file of whichever version `cgroup` is of
            if (cgroup / file).exists():
                try:
                    (cgroup / file).write_text(str(controller.limit_of(self._limits)))
                except OSError:
                    pass
                return

    def end(self, environment_id: str) -> bool:
        noted = self._note(environment_id)
        cgroups = _noted_cgroups(noted)
        if cgroups is None:
            return True  # no hook of it ever ran here
        cgroup, *limiting = cgroups
        if cgroup.exists():
            try:
                (cgroup / "cgroup.kill").write_text("1")
            except FileNotFoundError:
                pass  # removed meanwhile
            if not _emptied(cgroup):
                return False
        # Every process of the environment is in the first, killed there: the others are empty too.
        for each in (cgroup, *limiting):
            try:
                each.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                return False
        noted.unlink(missing_ok=True)
        return True

    def _note(self, environment_id: str) -> Path:
        return self._state_dir / environment_id


class MarkerContainment:
    def __init__(self, reason: str) -> None:
        self.description = (
            f"hook processes are found by the {MARKER} in their environment ({reason}): a process "
            "that runs a program with an environment of its own making is not contained"
        )

    def prepare(self, environment_id: str) -> list[str]:
        return []

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
def host_containment(state_dir: Path, limits: Limits) -> Containment:
    """The containment of this host's hooks, keeping its state in `state_dir`, holding each
    environment to `limits` where it can, chosen once per process and said in one log line."""
    import logging

    containment = _choose(state_dir, limits)
    logging.getLogger(__name__).info("%s", containment.description)
    return containment


def cgroup_root() -> Path | None:
    """Where this process's environments' cgroups are made (None: no cgroup v2 hierarchy)."""
    unified = _unified_mount()
    return None if unified is None else Path(unified + _own_cgroup()) / CGROUP_ROOT_NAME


def cgroup_roots() -> list[Path]:
    """Every root under which this process's environments' cgroups may be made: `cgroup_root`,
    and the same place in the v1 hierarchies that may hold their limits."""
    root = cgroup_root()
    return [
        *([] if root is None else [root]),
        *(v1_root for controller in CONTROLLERS if (v1_root := _v1_root(controller.name)) is not None),
    ]


def _choose(state_dir: Path, limits: Limits) -> Containment:
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
    return CgroupContainment(root, state_dir, limits, _limiting_roots(root))


def _limiting_roots(root: Path) -> dict[str, Path]:
    """Where each controller can limit the environments, by name: the unified hierarchy (`root`,
    once its children are given the controller) where it offers it, else a v1 hierarchy of the
    controller's own that this process can write."""
    offered = _words(root / "cgroup.controllers")
    for controller in CONTROLLERS:
        if controller.name in offered and controller.name not in _words(root / "cgroup.subtree_control"):
            try:
                (root / "cgroup.subtree_control").write_text(f"+{controller.name}")
            except OSError:
                pass  # refused (the controller is not delegated to us): a v1 hierarchy may still do
    enabled = _words(root / "cgroup.subtree_control")
    limiting = {}
    for controller in CONTROLLERS:
        if controller.name in enabled:
            limiting[controller.name] = root
        elif (v1_root := _v1_root(controller.name)) is not None:
            try:
                v1_root.mkdir(exist_ok=True)
            except OSError:
                continue
            if os.access(v1_root / "cgroup.procs", os.W_OK):
                limiting[controller.name] = v1_root
    return limiting


def _v1_root(controller: str) -> Path | None:
    """Where this process's environments' cgroups go in the v1 hierarchy of `controller`, if one
    is mounted (at its own root)."""
    try:
        with open("/proc/self/mountinfo") as mounts:
            mount = next(
                (
                    fields[4]
                    for fields in map(str.split, mounts)
                    if fields[fields.index("-") + 1] == "cgroup"
                    and fields[3] == "/"
                    and controller in fields[fields.index("-") + 3].split(",")
                ),
                None,
            )
        with open("/proc/self/cgroup") as cgroups:
            own = next(
                (
                    line.split(":", 2)[2].strip().rstrip("/")
                    for line in cgroups
                    if controller in line.split(":", 2)[1].split(",")
                ),
                None,
            )
    except OSError:
        return None
    return None if mount is None or own is None else Path(mount + own) / CGROUP_ROOT_NAME


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


def _noted_cgroups(noted: Path) -> list[Path] | None:
    """The cgroups noted for an environment, its unified one first; None when none is."""
    try:
        return [Path(line) for line in noted.read_text().splitlines() if line]
    except FileNotFoundError:
        return None


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _count_in(path: str, key: str) -> int | None:
    """The count `key` of a flat-keyed cgroup file ("key value" lines); None without that file."""
    try:
        with open(path) as counts:
            for line in counts:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except OSError:
        return None
    return 0


def _limit_value(cgroups: Sequence[str], controller: _Controller) -> int | None:
    for cgroup in cgroups:
        for file in controller.limit_files:
            try:
                with open(os.path.join(cgroup, file)) as limit:
                    text = limit.read().strip()
            except OSError:
                continue
            return int(text) if text.isdigit() else None
    return None


def _size(size: int) -> str:
    """`size` bytes as a person would say it: in the largest binary unit that divides it, else in bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


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
