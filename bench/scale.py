"""The service at scale: restart to serving and RSS with N environments in the log, `bb environment list` wall time.

A data dir is prepared once per size and kept under `$TMPDIR/bb-bench-scale/` for later runs: its log
is written by driving the domain application directly (as bench/replay.py does, no NATS) with
personal-workspace lifecycles whose directories are made where the provider plans them, then one
`bb serve` publishes the log and builds the read models, and is stopped once idle. Then, in the same
run, against the same on an empty data dir:

  (a) restart: start `bb serve` → serving (its server.json, written once the API listens), best and
      median of `--rounds` restarts;
  (b) RSS (VmRSS) of `bb serve` and, apart, of its nats-server and of its other processes (the hook
      launcher), after a restart, once the service and nats-server are idle;
  (c) `bb environment list --json --all` wall time (the real CLI, a subprocess) with 100 environments
      and with `--list-size` ready ones, and `bb environment list --all` (the table for a person) with
      100, against `python -c pass` of the same installation (the floor of any Python CLI there),
      with `bb --help` (the CLI's imports) as a row of its own. The CLI as
      a user installs it: a wheel built from this tree, pip-installed with its dependencies into a
      venv of its own (kept under `$TMPDIR/bb-bench-wheel-<uid>/`, by the tree's content, for later runs of
      the same tree). The list of 100 is also measured from this venv's editable install, every
      command of each row alternating with the others, since the editable finder (and, while
      PYTHONDONTWRITEBYTECODE is set, compiling this tree's modules at every start) slows every
      Python process started there.

    python bench/scale.py [--environments 10000] [--ready 0.4] [--list-size 10000] [--rounds 5]

`--environments 100000 --ready 1.0 --list-size 100000` measures restart, RSS and the list on one data
dir of 100,000 ready environments. Preparing it took 40 minutes here on a busy machine (about 120
environments/s written by the domain application, whose Python per save outweighs its SQLite commit,
then the first serve: 900,000 events published and consumed); later runs reuse it.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import hashlib
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from common import (
    ROOT,
    Figure,
    descendants,
    rss_mb,
    service_environment,
    start_service,
    stop_service,
    table,
    until_idle,
)
from replay import retirement, write_log

from bb_environments.handlers.application import Environments
from bb_environments.handlers.placement import Placement
from bb_environments.providers.personal_workspace import workspace_path

PRIMED = "bench-primed"
WHEEL_VENVS = Path(tempfile.gettempdir()) / f"bb-bench-wheel-{os.getuid()}"
NOT_SHIPPED = shutil.ignore_patterns(
    ".git", ".venv", "build", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache"
)
"""What a wheel is not built from: a checkout's caches, virtual environments and earlier builds."""
UNUSED_VENV_S = 24 * 3600
"""A wheel venv no run has used for this long (another tree's, an old one) is removed."""
LIFECYCLE_LAYOUT = "made-empty"
"""Names the log `personal_lifecycle` writes, in the primed data dirs: a change to it primes new ones."""
PUBLISH_S = 0.03
"""Seconds per environment that the first serve may take beyond a quarter of an hour to become idle."""


def personal_lifecycle(app: Environments, data_dir: Path, n: int, rng: random.Random, ready: float) -> Iterator[None]:
    """A personal workspace's life as the service writes it, a save at a time: spawned, then created
    in a directory made empty (its setup skipped and the environment ready in the same save); with
    probability 1 - `ready`, archived and removed."""
    thread_id = f"p{n}"
    path = workspace_path(str(data_dir / "providers" / "personal-workspace"), thread_id)
    environment = app.spawn_thread(
        thread_id, None, None, "local", None, Placement("personal-workspace", "local", None, None, thread_id, str(path))
    )
    yield
    path.mkdir(parents=True)
    app.record_created(environment.id, 1, str(path), True, None, None, empty=True)
    yield
    if rng.random() < ready:
        return
    yield from retirement(
        app,
        environment.id,
        [thread_id],
        lambda operation: app.record_teardown_skipped(environment.id, operation, "no .bb-env-teardown.sh"),
    )
    path.rmdir()  # as the provider's remove would have, once Removed is written


async def primed_data_dir(environments: int, ready: float) -> Path:
    """A data dir whose log holds `environments` lifecycles, already served once (log published, read
    models built); kept for later runs with the same sizes. A run stopped while serving it the first
    time goes on from its log: the next serve publishes what is left."""
    data_dir = (
        Path(tempfile.gettempdir())
        / "bb-bench-scale"
        / f"{environments}-environments-{ready:.2f}-ready-{LIFECYCLE_LAYOUT}"
    )
    if (data_dir / PRIMED).exists():
        return data_dir
    if not (data_dir / "events.sqlite").exists():  # written aside and renamed: whole or absent
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        started = time.perf_counter()
        print(
            f"writing {environments} environments into {data_dir} (reused by later runs)...",
            file=sys.stderr,
            flush=True,
        )
        write_log(
            data_dir / "events.sqlite",
            lambda app, rng: (personal_lifecycle(app, data_dir, n, rng, ready) for n in range(environments)),
        )
        print(f"  written in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    print("  first serve (publishes the log, builds the read models)...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    service, info = await start_service(data_dir)
    try:
        # Some 8 events per environment to publish and consume: about 25 minutes for 100,000 here.
        await until_idle([service.pid, info["natsPid"]], deadline_s=900 + environments * PUBLISH_S)
    finally:
        stop_service(service)
    print(f"  served and idle in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    (data_dir / PRIMED).touch()
    return data_dir


async def restarts(data_dir: Path, rounds: int) -> tuple[list[float], float, float, float]:
    """Seconds from start to serving of each restart; then, once idle after the last, the RSS (MB) of
    `bb serve`, of its nats-server, and of its other descendants (the hook launcher) together."""
    seconds = []
    for round_number in range(rounds):
        started = time.perf_counter()
        service, info = await start_service(data_dir)
        seconds.append(time.perf_counter() - started)
        try:
            if round_number == rounds - 1:
                await until_idle([service.pid, info["natsPid"]])
                others = [pid for pid in descendants(service.pid) if pid != info["natsPid"]]
                rss = rss_mb(service.pid), rss_mb(info["natsPid"]), sum(rss_mb(pid) for pid in others)
        finally:
            stop_service(service)
    return seconds, *rss


def tree_digest(root: Path) -> str:
    """A digest of every file a wheel of `root` is built from, names and contents."""
    digest = hashlib.sha256()
    for directory, folders, files in os.walk(root):
        skipped = NOT_SHIPPED(directory, [*folders, *files])
        folders[:] = sorted(f for f in folders if f not in skipped)
        for name in sorted(f for f in files if f not in skipped):
            path = Path(directory, name)
            digest.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def wheel_install() -> Path:
    """The bin directory of a venv holding this tree as a user installs it: a wheel built from a
    copy of the tree (a build in the checkout would leave build/ there), pip-installed with its
    dependencies. Made once per content of the tree; a run killed while making it leaves no
    `installed` mark, and the next run makes it again."""
    WHEEL_VENVS.mkdir(mode=0o700, exist_ok=True)
    if WHEEL_VENVS.stat().st_uid != os.getuid():  # its venv's bb is what the bench would run
        raise SystemExit(f"{WHEEL_VENVS} belongs to another user: remove it or set TMPDIR")
    home = WHEEL_VENVS / tree_digest(ROOT)[:16]
    installed = home / "installed"
    with open(WHEEL_VENVS / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second bench of the same tree waits for this one's venv
        if not installed.exists():
            _install_wheel(home)
    installed.touch()  # used now: see UNUSED_VENV_S
    for other in WHEEL_VENVS.iterdir():
        mark = other / "installed"
        if other != home and mark.exists() and time.time() - mark.stat().st_mtime > UNUSED_VENV_S:
            shutil.rmtree(other, ignore_errors=True)
    return home / "venv" / "bin"


def _install_wheel(home: Path) -> None:
    shutil.rmtree(home, ignore_errors=True)  # what a killed run left half made
    home.mkdir(parents=True)
    print(
        f"installing a wheel of this tree into {home} (reused while the tree is unchanged)...",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bb-bench-wheel-") as scratch:
        shutil.copytree(ROOT, Path(scratch, "source"), ignore=NOT_SHIPPED)
        _quietly(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", scratch, str(Path(scratch, "source"))]
        )
        (wheel,) = Path(scratch).glob("bb_environments-*.whl")
        _quietly([sys.executable, "-m", "venv", str(home / "venv")])
        _quietly([str(home / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)])
    (home / "installed").touch()


def _quietly(argv: list[str]) -> None:
    """Run a step of the install; its output only if it fails (pip warns of every index it skips)."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def editable_label() -> str:
    """What the editable install of this venv runs: whether this tree's modules start from cached
    bytecode, or are compiled at every start (PYTHONDONTWRITEBYTECODE set and no cache yet)."""
    cached = Path(importlib.util.cache_from_source(str(ROOT / "entrypoints" / "cli" / "__init__.py"))).exists()
    if cached or not sys.flags.dont_write_bytecode:
        return "editable install (`pip install -e`)"
    return "editable install (`pip install -e`), this tree's modules compiled at every start (PYTHONDONTWRITEBYTECODE)"


def wall_times(commands: dict[str, list[str]], data_dir: Path, runs: int) -> dict[str, tuple[float, bytes]]:
    """Median wall time of `runs` runs of each command, the commands alternating (a machine shared
    with other work drifts), and each one's last output."""
    times: dict[str, list[float]] = {label: [] for label in commands}
    outputs = {label: b"" for label in commands}
    for round_number in range(runs):
        order = list(commands) if round_number % 2 == 0 else list(reversed(commands))
        for label in order:
            started = time.perf_counter()
            outputs[label] = subprocess.run(
                commands[label], env=service_environment(data_dir), check=True, stdout=subprocess.PIPE
            ).stdout
            times[label].append(time.perf_counter() - started)
    return {label: (statistics.median(times[label]), outputs[label]) for label in commands}


async def list_times(data_dir: Path, commands: dict[str, list[str]], runs: int) -> dict[str, tuple[float, bytes]]:
    """`wall_times` of `commands` against a running service on `data_dir`, once it is idle."""
    service, info = await start_service(data_dir)
    try:
        await until_idle([service.pid, info["natsPid"]])
        return wall_times(commands, data_dir, runs)
    finally:
        stop_service(service)


async def measure(
    environments: int, list_sizes: list[int], rounds: int, ready: float = 0.4, list_runs: int = 15
) -> list[Figure]:
    wheel = wheel_install()
    editable = Path(sys.executable).parent
    empty = Path(tempfile.mkdtemp(prefix="bb-bench-empty-"))
    try:
        service, _ = await start_service(empty)  # credentials and streams made once, as on any data dir
        stop_service(service)
        base_seconds, base_rss, base_nats_rss, base_other_rss = await restarts(empty, rounds)
        full = await primed_data_dir(environments, ready)
        seconds, rss, nats_rss, other_rss = await restarts(full, rounds)
        helped = wall_times(
            {"help": [str(wheel / "bb"), "--help"], "floor": [str(wheel / "python"), "-c", "pass"]}, empty, list_runs
        )
        listed = []
        for size in list_sizes:
            listing = ["environment", "list", "--all"]
            commands = {"json": [str(wheel / "bb"), *listing, "--json"], "floor": [str(wheel / "python"), "-c", "pass"]}
            if size <= 100:  # the goal's size: the table for a person, and the editable install, too
                commands |= {
                    "table": [str(wheel / "bb"), *listing],
                    "editable json": [str(editable / "bb"), *listing, "--json"],
                    "editable floor": [str(editable / "python"), "-c", "pass"],
                }
            listed.append((size, await list_times(await primed_data_dir(size, ready=1.0), commands, list_runs)))
    finally:
        shutil.rmtree(empty, ignore_errors=True)
    best, median = min(seconds), statistics.median(seconds)
    goals = environments <= 10_000  # the goals are set for 10,000 environments
    installed = {"wheel": "installed from a wheel", "editable": editable_label()}
    figures = [
        Figure(
            f"restart → serving, {environments:,} environments in the log (median of {rounds})",
            median,
            statistics.median(base_seconds),
            "s",
            "empty log, median",
            "≤ 3 s" if goals else "",
            median <= 3 if goals else None,
            f"best {best:.2f} s",
        ),
        Figure(
            f"RSS of `bb serve`, {environments:,} environments, idle after restart",
            rss,
            base_rss,
            "MB",
            "empty log",
            "≤ 150 MB" if goals else "",
            rss <= 150 if goals else None,
        ),
        Figure(
            f"RSS of its nats-server, {environments:,} environments (not in the row above)",
            nats_rss,
            base_nats_rss,
            "MB",
            "empty log",
        ),
        Figure(
            f"RSS of its other processes (hook launcher), {environments:,} environments, summed",
            other_rss,
            base_other_rss,
            "MB",
            "empty log",
        ),
        Figure(
            f"`bb --help` wall time, {installed['wheel']} (median of {list_runs})",
            helped["help"][0],
            helped["floor"][0],
            "s",
            "`python -c pass`, same venv",
        ),
    ]
    wheel_floor = "`python -c pass`, same venv"
    for size, measured in listed:
        count = len(json.loads(measured["json"][1])["environments"])
        goal, met = (
            ("≤ 0.15 s", measured["json"][0] <= 0.15 and count == size) if size <= 100 else ("works", count == size)
        )
        figures.append(
            Figure(
                f"`bb environment list --json --all`, {size:,} environments, {installed['wheel']} "
                f"(median of {list_runs})",
                measured["json"][0],
                measured["floor"][0],
                "s",
                wheel_floor,
                goal,
                met,
                f"listed {count:,}",
            )
        )
        if "table" in measured:
            rows = len(measured["table"][1].splitlines()) - 1  # below the header
            figures.append(
                Figure(
                    f"`bb environment list --all` (the table for a person), {size:,} environments, "
                    f"{installed['wheel']} (median of {list_runs})",
                    measured["table"][0],
                    measured["floor"][0],
                    "s",
                    wheel_floor,
                    "≤ 0.15 s",
                    measured["table"][0] <= 0.15 and rows == size,
                    f"{rows:,} rows",
                )
            )
        if "editable json" in measured:  # no goal: what a checkout adds to the user's figure
            figures.append(
                Figure(
                    f"`bb environment list --json --all`, {size:,} environments, {installed['editable']} "
                    f"(median of {list_runs})",
                    measured["editable json"][0],
                    measured["editable floor"][0],
                    "s",
                    wheel_floor,
                    "",
                    None,
                    f"listed {count:,}",
                )
            )
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--environments", type=int, default=10_000)
    parser.add_argument(
        "--ready", type=float, default=0.4, help="the share of those left ready; the others are archived and removed"
    )
    parser.add_argument("--list-size", type=int, default=10_000, help="besides 100; 100000 takes long to prepare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--list-runs", type=int, default=15, help="runs of each command whose wall time is measured")
    arguments = parser.parse_args()
    print(
        table(
            asyncio.run(
                measure(
                    arguments.environments,
                    [100, arguments.list_size],
                    arguments.rounds,
                    arguments.ready,
                    arguments.list_runs,
                )
            )
        )
    )
