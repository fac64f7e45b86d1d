"""Runs one hook script and records its outcome, outliving the service that started it.

    python -m providers.host.hook_supervisor RECORDS_DIR OPERATION_ID TIMEOUT_S

Standard library only, without argparse: its start-up time is part of every hook's latency.

The runner starts this in its own session, writes the fresh record, then records this process's
pid and start time in it ("adoption"). Until adopted, the supervisor does nothing: a runner that
died before adopting it leaves a record that a restarted runner closes as interrupted, and an
unadopted supervisor must not start a script behind that verdict. Once adopted, the supervisor
is the only writer of the record until it exits; its last act is writing the outcome.

SIGTERM cancels: the script's process group is killed and the outcome is "cancelled".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from providers.host.hook_records import (
    HookRecord,
    HookRecords,
    RecordedOutcome,
    kill_group_and_wait,
    now_iso,
    process_start_ticks,
)

ADOPTION_WAIT_S = 10.0
ADOPTION_POLL_S = 0.005
HANDLED_SIGNALS = {signal.SIGTERM, signal.SIGCHLD}
WITHHELD_ENV_PREFIXES = ("BB_", "NATS_", "MODAL_TOKEN_")


def main(argv: list[str] | None = None) -> None:
    records_dir, operation_id, timeout = sys.argv[1:] if argv is None else argv
    # Blocked from the start so a SIGTERM that arrives at any moment stays pending until we look.
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    records = HookRecords(Path(records_dir))
    record = _wait_for_adoption(records, operation_id)
    if record is None:
        return
    if records.is_tombstoned(record.operation_id) or _sigterm_pending():
        _finish(records, record, "cancelled", None, "cancelled before it started")
        return
    _supervise(records, record, float(timeout))


def _wait_for_adoption(records: HookRecords, operation_id: str) -> HookRecord | None:
    """The record once it names this process as its supervisor; None if that never happens."""
    me, my_start = os.getpid(), process_start_ticks(os.getpid())

    def adopted(record: HookRecord | None) -> bool:
        return record is not None and record.supervisor_pid == me and record.supervisor_started_at == my_start

    deadline = time.monotonic() + ADOPTION_WAIT_S
    while time.monotonic() < deadline and not _sigterm_pending():
        record = records.read(operation_id)
        if record is None or record.finished_at is not None:
            return None
        if adopted(record):
            return record
        time.sleep(ADOPTION_POLL_S)
    record = records.read(operation_id)
    return record if adopted(record) and record.finished_at is None else None


def _sigterm_pending() -> bool:
    return signal.SIGTERM in signal.sigpending()


def _supervise(records: HookRecords, record: HookRecord, timeout_s: float) -> None:
    script = Path(record.script)
    log = os.open(records.log_path(record.operation_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        process = subprocess.Popen(
            ["bash", str(script)],
            cwd=record.workspace,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=_script_environment(),
            start_new_session=True,
            preexec_fn=_unblock_handled_signals,
        )
    except OSError as error:
        _finish(records, record, "failed", None, f"{script.name} could not start: {error}")
        return
    finally:
        os.close(log)
    record.script_pid = process.pid
    record.script_started_at = process_start_ticks(process.pid)
    records.write(record)

    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            confirmed = _kill_script(process)
            message = f"{script.name} timed out after {timeout_s:g}s" + _unconfirmed(confirmed)
            _finish(records, record, "timed_out", None, message)
            return
        received = signal.sigtimedwait(HANDLED_SIGNALS, remaining)
        if received is not None and received.si_signo == signal.SIGTERM:
            confirmed = _kill_script(process)
            _finish(records, record, "cancelled", None, f"{script.name} cancelled" + _unconfirmed(confirmed))
            return
    _finish_with_exit_status(records, record, process.returncode)


def _unblock_handled_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)


def _script_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith(WITHHELD_ENV_PREFIXES)}


def _kill_script(process: subprocess.Popen[bytes]) -> bool:
    """Kill the script's whole group; True once no member is left alive."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Reap the leader first: until then it is a zombie still counted in its group.
    process.wait()
    return kill_group_and_wait(process.pid)


def _unconfirmed(confirmed: bool) -> str:
    return "" if confirmed else "; some of its processes could not be confirmed stopped"


def _finish_with_exit_status(records: HookRecords, record: HookRecord, returncode: int) -> None:
    name = Path(record.script).name
    if returncode == 0:
        _finish(records, record, "succeeded", 0, None)
    elif returncode < 0:
        _finish(records, record, "failed", None, f"{name} exited via signal {signal.Signals(-returncode).name}")
    else:
        _finish(records, record, "failed", returncode, f"{name} failed with exit code {returncode}")


def _finish(
    records: HookRecords, record: HookRecord, outcome: RecordedOutcome, exit_code: int | None, message: str | None
) -> None:
    record.outcome = outcome
    record.exit_code = exit_code
    record.message = message
    record.finished_at = now_iso()
    records.write(record)


if __name__ == "__main__":
    main()
