"""Containment of an environment's processes, each mechanism on real processes that hide the way
daemons do (a new session, `cd /`, a double fork)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bb_environments.entrypoints.config import MAX_MEMORY_PER_ENVIRONMENT, MAX_PIDS_PER_ENVIRONMENT
from bb_environments.providers.host.containment import (
    MARKER,
    CgroupContainment,
    Containment,
    Limits,
    MarkerContainment,
    _choose,
    enter_cgroup,
)
from bb_environments.providers.host.processes import pid_alive

LIMITS = Limits(MAX_PIDS_PER_ENVIRONMENT, MAX_MEMORY_PER_ENVIRONMENT)
DAEMON = (
    'setsid bash -c \'cd / && bash -c "echo \\$\\$ > {pid_file}; exec sleep 600" '
    "</dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1 &"
)


def start_daemon(tmp_path: Path, environment_id: str, cgroups: list[str]) -> int:
    """What a hook does that leaves a daemon, started the way a supervisor starts the hook."""
    pid_file = tmp_path / f"{environment_id}.pid"
    subprocess.run(
        ["bash", "-c", DAEMON.format(pid_file=pid_file)],
        check=True,
        env={**os.environ, MARKER: environment_id},
        preexec_fn=lambda: [enter_cgroup(cgroup) for cgroup in cgroups],
    )
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the daemon did not start"
        time.sleep(0.01)
    return int(pid_file.read_text())


def cgroup_containment(tmp_path: Path) -> CgroupContainment:
    chosen = _choose(tmp_path / "state", LIMITS)
    if not isinstance(chosen, CgroupContainment):
        pytest.skip(f"no writable cgroup v2 here: {chosen.description}")
    return chosen


def test_the_environments_processes_end_and_another_environments_live_on(tmp_path):
    for containment in (cgroup_containment(tmp_path), MarkerContainment("chosen by the test")):
        ending = start_daemon(tmp_path, f"ending-{id(containment)}", containment.prepare(f"ending-{id(containment)}"))
        other = start_daemon(tmp_path, f"other-{id(containment)}", containment.prepare(f"other-{id(containment)}"))
        try:
            assert containment.end(f"ending-{id(containment)}")
            assert not pid_alive(ending), containment.description
            assert pid_alive(other), "another environment's daemon was ended"
        finally:
            assert containment.end(f"other-{id(containment)}")
        assert not pid_alive(other)


def test_a_cgroup_is_found_again_by_a_process_that_did_not_make_it(tmp_path):
    """What a restart after a crash does: a new containment on the same state dir."""
    first = cgroup_containment(tmp_path)
    cgroups = first.prepare("env")
    pid = start_daemon(tmp_path, "env", cgroups)
    restarted: Containment = _choose(tmp_path / "state", LIMITS)
    assert restarted.end("env")
    assert not pid_alive(pid)
    assert not any(Path(cgroup).exists() for cgroup in cgroups)
    assert list((tmp_path / "state").iterdir()) == []  # nothing kept for a removed environment
    assert restarted.end("env")  # a removal retried finds nothing left to end


def test_an_environment_whose_hooks_never_ran_has_nothing_to_end(tmp_path):
    assert cgroup_containment(tmp_path).end("never-ran")
    assert MarkerContainment("chosen by the test").end("never-ran")
