"""What the benches share: a real `bb serve` to measure, the bare git baseline, percentiles, process
figures from /proc, and the one table every bench prints (measure | ours | baseline | ratio | goal | met?)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Figure:
    """One row of the table: our figure beside the baseline measured in the same run."""

    measure: str
    ours: float
    baseline: float | None
    unit: str
    baseline_name: str = ""
    goal: str = ""
    met: bool | None = None
    note: str = ""


def _number(value: float, unit: str) -> str:
    digits = 0 if abs(value) >= 1000 else 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
    return f"{value:,.{digits}f} {unit}"


def table(figures: list[Figure]) -> str:
    """A Markdown table: as readable in a terminal as it is pasted into docs/benchmarks.md."""
    lines = ["| measure | ours | baseline | ratio | goal | met? |", "|---|---:|---|---:|---|---|"]
    for f in figures:
        baseline = "-" if f.baseline is None else f"{_number(f.baseline, f.unit)} ({f.baseline_name})"
        ratio = "-" if not f.baseline else f"{f.ours / f.baseline:.3g}×"
        met = {True: "yes", False: "**no**", None: "-"}[f.met]
        ours = _number(f.ours, f.unit) + (f" ({f.note})" if f.note else "")
        lines.append(f"| {f.measure} | {ours} | {baseline} | {ratio} | {f.goal or '-'} | {met} |")
    return "\n".join(lines)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def service_environment(data_dir: Path, **settings: str) -> dict[str, str]:
    """`settings`: BB_* variables beside the benches' own."""
    return {
        **os.environ,
        "BB_DATA_DIR": str(data_dir),
        "BB_RETIRE_GRACE_MS": "0",
        "BB_LOG_LEVEL": "WARNING",
        **settings,
    }


async def start_service(data_dir: Path, **settings: str) -> tuple[subprocess.Popen[bytes], dict]:
    """`bb serve` on `data_dir` (with `settings`, see service_environment), once it serves: its own
    server.json is written and the API answers."""
    from bb_environments.bus.api_client.nats_client import ApiClient
    from bb_environments.bus.wire.api_messages import ListEnvironments

    server_file = data_dir / "server.json"
    service = subprocess.Popen(
        [sys.executable, "-m", "bb_environments.entrypoints.bb", "serve"],
        env=service_environment(data_dir, **settings),
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    while True:
        if service.poll() is not None:
            raise RuntimeError(f"bb serve on {data_dir} exited with status {service.returncode} before serving")
        try:
            info = json.loads(server_file.read_text())
            if info["pid"] == service.pid:  # not one a killed run left behind
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        await asyncio.sleep(0.01)
    api = await ApiClient.connect(info["natsUrl"], nkeys_seed=info["credentials"]["operator"])
    try:
        await api.call("environments", "list", ListEnvironments(limit=1))
    finally:
        await api.close()
    return service, info


def stop_service(service: subprocess.Popen[bytes]) -> None:
    # SIGINT, not SIGTERM: just after server.json is written, `bb serve` has not yet installed its
    # handlers, and a SIGTERM then ends it without stopping its nats-server; asyncio.run turns an
    # early SIGINT into a cancellation that still unwinds everything it started.
    service.send_signal(signal.SIGINT)
    service.wait()


def make_repository(root: Path) -> Path:
    repo = root / "repo"
    subprocess.run(["git", "init", "--quiet", "--initial-branch=main", str(repo)], check=True)
    for i in range(20):
        (repo / f"file{i}.txt").write_text(f"content {i}\n" * 50)
    (repo / ".bb-env-setup.sh").write_text("echo ready > .setup-done\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@e", "commit", "--quiet", "-m", "x"],
        check=True,
    )
    return repo


def baseline_once(repo: Path, target: Path, branch: str) -> float:
    """The bare baseline of a spawn: `git worktree add` and the setup script, in one shell; the
    script run by bash, as the service runs it (a `sh` that is dash starts in half the time)."""
    started = time.perf_counter()
    subprocess.run(
        [
            "bash",
            "-c",
            f'git -C "{repo}" worktree add --quiet -b "{branch}" "{target}" && cd "{target}" && bash .bb-env-setup.sh',
        ],
        check=True,
    )
    return time.perf_counter() - started


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} reports no VmRSS")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children of children included."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            pass  # ended while read
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found


def tree_cpu_seconds(roots: list[int]) -> float:
    """The CPU time of every process of the trees below `roots`: each live one's own and that of the
    children it has reaped (a PostgreSQL backend that ended, a hook), so that none is missed between
    two readings. A process that ends between them takes its time to its parent."""
    ticks = 0
    for pid in {*roots, *(child for root in roots for child in descendants(root))}:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while read
        ticks += sum(int(field) for field in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


class Readiness:
    """When each thread's environment was first announced on `bb.environments.*.ready`, and a wait
    for a set of threads to get there."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self._waiting: dict[str, asyncio.Future[None]] = {}

    async def subscribe(self, nc) -> None:
        await nc.subscribe("bb.environments.*.ready", cb=self._on_ready)

    async def _on_ready(self, message) -> None:
        for thread_id in json.loads(message.data)["threadIds"]:
            self.at.setdefault(thread_id, time.perf_counter())
            if thread_id in self._waiting and not self._waiting[thread_id].done():
                self._waiting[thread_id].set_result(None)

    async def until(self, thread_ids: list[str], timeout: float = 300) -> None:
        loop = asyncio.get_running_loop()
        for thread_id in thread_ids:
            self._waiting[thread_id] = loop.create_future()
            if thread_id in self.at:
                self._waiting[thread_id].set_result(None)
        await asyncio.wait_for(asyncio.gather(*(self._waiting[t] for t in thread_ids)), timeout)


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        # Fields after the command name, which may hold spaces: utime and stime are the 12th and 13th.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def until_idle(
    pids: list[int],
    deadline_s: float = 900,
    window_s: float = 1.0,
    busy: float = 0.1,
    cpu: Callable[[list[int]], float] = cpu_seconds,
) -> float:
    """Wait until the processes use under `busy` of a core over two windows in a row (the relay and
    the consumers done with what a start found in the log); the seconds waited. `cpu`: how their
    time is read (tree_cpu_seconds: theirs and their descendants')."""
    started = time.perf_counter()
    quiet, used = 0, cpu(pids)
    while quiet < 2:
        if time.perf_counter() - started > deadline_s:
            raise TimeoutError(f"processes {pids} still busy after {deadline_s} s")
        await asyncio.sleep(window_s)
        now = cpu(pids)
        quiet = quiet + 1 if now - used < busy * window_s else 0
        used = now
    return time.perf_counter() - started
