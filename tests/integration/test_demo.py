"""README's demo.sh, run as a user runs it: it shows the retire grace in force and the whole main
job, and leaves no trail: its temporary directory is gone, and no process it started lives on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import service_environment

ROOT = Path(__file__).resolve().parents[2]


def processes_naming(fragment: str) -> list[str]:
    """The command lines of this machine's processes that name `fragment`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # ended meanwhile, or not ours to read
                continue
            if fragment in command:
                found.append(command)
    return found


def test_the_demo_shows_the_grace_in_force_and_leaves_no_trail(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = service_environment(tmp_path / "unused")
    del environment["BB_DATA_DIR"], environment["BB_RETIRE_GRACE_MS"]  # the demo sets its own
    environment.update(
        TMPDIR=str(scratch), PATH=os.pathsep.join([str(Path(sys.executable).parent), environment["PATH"]])
    )

    demo = subprocess.run(["bash", str(ROOT / "demo.sh")], env=environment, capture_output=True, text=True, timeout=300)

    assert demo.returncode == 0, demo.stderr[-3000:]
    providers = demo.stdout.split("== providers", 1)[1].split("== spawn", 1)[0]
    git_worktree = next(line for line in providers.splitlines() if line.startswith("git-worktree"))
    assert git_worktree.rstrip().endswith("0 ms"), providers  # the grace in force, not the provider's 5 min
    assert '"type":"removed"' in demo.stdout.split("== event log", 1)[1]
    assert "installing dependencies for" in demo.stdout.split("== its transcript", 1)[1]
    assert list(scratch.iterdir()) == []
    assert processes_naming(str(scratch)) == []
