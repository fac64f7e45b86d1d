"""Runs one hook script and records its outcome, outliving the service that started it.

    python -m bb_environments.hooks.supervisor RECORDS_DIR OPERATION_ID TIMEOUT_S SYNC_LEVEL [OUTPUT_MAX_BYTES]

Standard library only (and so is all it imports from this package), without argparse: its
start-up time is part of a runner's first hook.

The runner does not start a Python interpreter per hook: it keeps one launcher (see launcher)
that has imported all of this once, and asks it for a supervisor per hook. The launcher forks (no
exec), and the child becomes the supervisor in its own session, so it outlives both the launcher
and the service.

The runner writes the operation's record naming this process, pid and start time, as its
supervisor ("adoption"). Until adopted, the supervisor does nothing: a supervisor whose runner died
before adopting it gives up after ADOPTION_WAIT_S, and an unadopted supervisor must not start a
script behind a restarted runner's back. A record found without a supervisor is closed as
interrupted by a restarted runner. Once adopted, the supervisor is the only writer of the record
until it exits; its last act is writing the outcome. The runner sends ADOPTED_SIGNAL once it has
written the record, so the supervisor need not wait for its next poll of the record.

A disk that refuses the outcome for lack of space does not lose it: the supervisor retries the
write, with backoff, for as long as it takes, and meanwhile hands the outcome to whoever asks
(see records.HeldOutcome). Exiting without it would leave the script "interrupted", and its
environment in error, although the script ran to its end.

SIGTERM cancels: the script's process group is killed and the outcome is "cancelled".

The script's output reaches the log through a pipe this process copies, bounded (see output_log);
the outcome is written once what the script wrote before it ended is in the log. Processes the
script leaves running keep the pipe, and this process copies their output until they end, after
it has told the runner it is done.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bb_environments.hooks.output_log import DEFAULT_OUTPUT_MAX_BYTES, BoundedLog, OutputCopier, SecretMask
from bb_environments.hooks.protocol import ADOPTED_SIGNAL
from bb_environments.hooks.records import OUT_OF_SPACE, SYNC_LEVELS, HeldOutcome, HookRecord, HookRecords, now_iso
from bb_environments.providers.host.containment import enter_cgroup, limit_counts, limits_hit
from bb_environments.providers.host.processes import kill_group_and_wait, process_start_ticks
from bb_environments.providers.host.withheld import without_secrets
from bb_environments.providers.host.workspace_user import WorkspaceUser

if TYPE_CHECKING:  # the launcher imports this module without site-packages: names for the checker only
    from bb_environments.domain.hook_operations import HookOutcomeStatus

ADOPTION_WAIT_S = 10.0
ADOPTION_POLL_S = 0.005
HANDLED_SIGNALS = {signal.SIGTERM, signal.SIGCHLD}
BLOCKED_SIGNALS = HANDLED_SIGNALS | {ADOPTED_SIGNAL}
# Python ignores these; the script gets them back at their defaults, as subprocess would do.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
# Between attempts to write an outcome the disk refused: doubling from the first to the last.
RECORD_RETRY_FIRST_S = 0.05
RECORD_RETRY_MAX_S = 5.0


def main(
    argv: list[str] | None = None,
    environment: dict[str, str] | None = None,
    done_fds: tuple[int, ...] = (),
    *,
    cgroups: list[str] | None = None,
    run_as: WorkspaceUser | None = None,
    git_hook: list[str] | None = None,
    masked: list[str] | None = None,
) -> None:
    """Supervise one hook; the script's environment is `environment`, else os.environ without the
    service's variables.
    `done_fds` are closed once the outcome is recorded (the runner's notice, see launcher). The
    script runs in `cgroups` (its environment's, see providers/host/containment.py) and as `run_as`,
    when given; `git_hook`, the command of a git hook the workspace's checkout owes, runs first,
    the same way and within the same timeout: its failure is the hook's, as git's post-checkout
    is the exit status of the checkout that ran it. The values of the variables named in `masked`
    (the project's secrets) are written to the log as `***`."""
    records_dir, operation_id, timeout, sync, *bound = sys.argv[1:] if argv is None else argv
    output_max_bytes = int(bound[0]) if bound else DEFAULT_OUTPUT_MAX_BYTES
    output = None
    try:
        output = _adopt_and_supervise(
            records_dir,
            operation_id,
            float(timeout),
            sync,
            output_max_bytes,
            environment,
            cgroups or [],
            run_as,
            git_hook,
            masked or [],
        )
    finally:
        for fd in done_fds:
            os.close(fd)
    if output is not None:
        output.follow_to_end()


def _adopt_and_supervise(
    records_dir: str,
    operation_id: str,
    timeout_s: float,
    sync: str,
    output_max_bytes: int,
    environment: dict[str, str] | None,
    cgroups: list[str],
    run_as: WorkspaceUser | None,
    git_hook: list[str] | None,
    masked: list[str],
) -> OutputCopier | None:
    # Blocked from the start so a SIGTERM that arrives at any moment stays pending until we look.
    # (A supervisor forked by the launcher is born with them blocked.)
    signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_SIGNALS)
    # Prepared while the runner writes the record; none of it touches the hook. The runner's
    # environment is the hook's as it built it (withheld.hook_environment), given variables included.
    script_environment = without_secrets(os.environ) if environment is None else dict(environment)
    executable = _find_executable("bash", script_environment)
    if sync not in SYNC_LEVELS:
        raise ValueError(f"unknown sync level {sync!r}")
    records = HookRecords(Path(records_dir), sync)
    record = _wait_for_adoption(records, operation_id)
    if record is None:
        return None
    if records.is_tombstoned(record.operation_id) or _sigterm_pending():
        _finish(records, record, "cancelled", None, "cancelled before it started")
        return None
    mask = SecretMask([script_environment[name].encode() for name in masked if name in script_environment])
    return _supervise(
        records, record, timeout_s, output_max_bytes, executable, script_environment, cgroups, run_as, git_hook, mask
    )


def _wait_for_adoption(records: HookRecords, operation_id: str) -> HookRecord | None:
    """The record once it names this process as its supervisor; None if that never happens.

    No record yet is not a refusal: the runner writes the record only after this process exists.
    """
    me, my_start = os.getpid(), process_start_ticks(os.getpid())

    def adopted(record: HookRecord | None) -> bool:
        return record is not None and record.supervisor_pid == me and record.supervisor_started_at == my_start

    deadline = time.monotonic() + ADOPTION_WAIT_S
    while True:
        record = records.read(operation_id)
        if record is not None and record.finished_at is not None:
            return None
        if adopted(record):
            return record
        remaining = deadline - time.monotonic()
        if remaining <= 0 or _sigterm_pending():
            return None
        signal.sigtimedwait({ADOPTED_SIGNAL}, min(ADOPTION_POLL_S, remaining))


def _sigterm_pending() -> bool:
    return signal.SIGTERM in signal.sigpending()


def _supervise(
    records: HookRecords,
    record: HookRecord,
    timeout_s: float,
    output_max_bytes: int,
    executable: str | OSError,
    environment: dict[str, str],
    cgroups: list[str],
    run_as: WorkspaceUser | None,
    git_hook: list[str] | None,
    mask: SecretMask,
) -> OutputCopier | None:
    """Run the git hook owed, if any, then the script, to the outcome; the copier of their output,
    which processes they left may still hold. Without a script, the git hook's outcome is the hook's."""
    script = Path(record.script)
    commands: list[tuple[str, str | OSError, list[str]]] = []
    if git_hook is not None:
        commands.append((f"{Path(git_hook[0]).name} (the repository's git hook)", git_hook[0], git_hook))
    if git_hook is None or os.path.lexists(script):
        resolved = _inside_workspace(record)
        if isinstance(resolved, str):
            _finish(records, record, "failed", None, resolved)
            return None
        commands.append((script.name, executable, ["bash", str(resolved)]))
    for cgroup in cgroups:
        # This process first: the script, and all it starts, are then born in the cgroup.
        try:
            enter_cgroup(cgroup)
        except OSError as error:
            _finish(records, record, "failed", None, f"{script.name} could not be contained in {cgroup}: {error}")
            return None
    # A hook that fails having hit its environment's limits says so: counted from here.
    counted = limit_counts(cgroups)

    def limits(message: str) -> str:
        hit = limits_hit(cgroups, counted)
        return f"{message}: the {record.kind} hit {' and '.join(hit)}" if hit else message

    output, write_end = _output_pipe(records, record, output_max_bytes, mask)
    deadline = time.monotonic() + timeout_s
    try:
        for number, (name, command_executable, arguments) in enumerate(commands, start=1):
            try:
                pid = _spawn(record.workspace, command_executable, arguments, environment, write_end, run_as)
            except OSError as error:
                _finish(records, record, "failed", None, f"{name} could not start: {error}")
                return output
            record.script_pid = pid
            record.script_started_at = process_start_ticks(pid)
            try:
                records.write(record)
            except OSError as error:
                # Not worth the script's life: this process knows the pid, and the outcome's write
                # records it. Only a restarted runner that finds this process killed will lack it.
                if error.errno not in OUT_OF_SPACE:
                    raise
            status = _wait_for_exit(pid, deadline)
            if isinstance(status, str):
                confirmed = _kill_script(pid)
                output.drain()
                if status == "timed_out":
                    _finish(
                        records,
                        record,
                        "timed_out",
                        None,
                        limits(f"{name} timed out after {timeout_s:g}s") + _unconfirmed(confirmed),
                    )
                else:
                    _finish(records, record, "cancelled", None, f"{name} cancelled" + _unconfirmed(confirmed))
                return output
            returncode = os.waitstatus_to_exitcode(status)
            if returncode != 0 or number == len(commands):
                output.drain()
                _finish_with_exit_status(records, record, name, returncode, limits)
                return output
    finally:
        os.close(write_end)
    return output


def _wait_for_exit(pid: int, deadline: float) -> int | Literal["timed_out", "cancelled"]:
    """The process's wait status once it exited (reaped), or what ended the wait first."""
    while (status := _exit_status(pid)) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timed_out"
        received = signal.sigtimedwait(HANDLED_SIGNALS, remaining)
        if received is not None and received.si_signo == signal.SIGTERM:
            return "cancelled"
    return status


def _inside_workspace(record: HookRecord) -> Path | str:
    """The script with its symlinks resolved, if it stays inside the workspace; else why it is not run.

    Checked here, just before bash opens it, rather than when the runner found the script: the
    repository chooses what a script is, and a symlink would make the hook run a file of the
    service's user outside the workspace (SPEC 9). bash gets the resolved path, so no symlink is
    followed again between the check and the open. What remains, a path component swapped in that
    gap, needs a process already running in the workspace: code of the repository that ran as
    this same user already."""
    script = Path(record.script)
    workspace = os.path.realpath(record.workspace)
    resolved = os.path.realpath(script)
    if os.path.commonpath([workspace, resolved]) != workspace:
        return f"{script.name} is a symlink to {resolved}, outside the workspace: not run"
    if not os.path.isfile(resolved):
        return f"{script.name} is not a regular file: not run"
    return Path(resolved)


def _output_pipe(
    records: HookRecords, record: HookRecord, output_max_bytes: int, mask: SecretMask
) -> tuple[OutputCopier, int]:
    """The copier from a pipe into the operation's log, and the pipe's write end for what runs.
    One pipe for all the hook runs, so that its output has one bound and one order."""
    log = os.open(records.log_path(record.operation_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    read_end, write_end = os.pipe()
    return OutputCopier(read_end, BoundedLog(log, output_max_bytes), mask), write_end


def _spawn(
    workspace: str,
    executable: str | OSError,
    arguments: list[str],
    environment: dict[str, str],
    output: int,
    run_as: WorkspaceUser | None,
) -> int:
    """Start `arguments` in the workspace, in its own session, with no signal blocked, its
    output into `output`.

    posix_spawn rather than subprocess: it can set the child's signal mask without a preexec_fn,
    so the child is spawned with vfork instead of a full fork of this process. posix_spawn cannot
    change the child's user, so a script run as another user is forked and executed by hand
    (`_fork_as`). This process has no other use for its working directory (the records directory
    is absolute), so it changes into the workspace itself.
    """
    os.chdir(workspace)
    if isinstance(executable, OSError):
        raise executable
    if run_as is not None:
        return _fork_as(run_as, executable, arguments, environment | run_as.hook_environment(), output)
    return os.posix_spawn(
        executable,
        arguments,
        environment,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, output, 1),
            (os.POSIX_SPAWN_DUP2, output, 2),
        ],
        setsid=True,
        setsigmask=(),
        setsigdef=RESTORED_SIGNALS,
    )


def _fork_as(
    user: WorkspaceUser, executable: str, arguments: list[str], environment: dict[str, str], output: int
) -> int:
    """What `_spawn`'s posix_spawn does, as `user` (its groups, gid and uid, in that order:
    each step needs the privilege the next one drops). Safe to fork: this process has one thread.
    An error before the exec comes back through a pipe and is raised here, as posix_spawn's would."""
    errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            stdin = os.open(os.devnull, os.O_RDONLY)
            os.dup2(stdin, 0)
            os.dup2(output, 1)
            os.dup2(output, 2)
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            for restored in RESTORED_SIGNALS:
                signal.signal(restored, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.execve(executable, arguments, environment)
        except OSError as error:
            os.write(errors_write, str(error.errno).encode())
        finally:
            os._exit(127)
    os.close(errors_write)
    try:
        failed = os.read(errors_read, 32)
    finally:
        os.close(errors_read)
    if failed:
        os.waitpid(pid, 0)
        code = int(failed)
        raise OSError(code, f"{os.strerror(code)} (as user {user.name})")
    return pid


def _find_executable(name: str, environment: Mapping[str, str]) -> str | OSError:
    """`name` looked up in the PATH of `environment`, as subprocess looks up its command.

    The error, if none is found, is returned to be raised when the script would have started.
    """
    for directory in os.get_exec_path(environment):
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _exit_status(pid: int) -> int | None:
    """The script's wait status once it has exited (reaping it), else None."""
    reaped, status = os.waitpid(pid, os.WNOHANG)
    return status if reaped else None


def _kill_script(pid: int) -> bool:
    """Kill the script's whole group; True once no member is left alive."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Reap the leader first: until then it is a zombie still counted in its group.
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return kill_group_and_wait(pid)


def _unconfirmed(confirmed: bool) -> str:
    return "" if confirmed else "; some of its processes could not be confirmed stopped"


def _finish_with_exit_status(
    records: HookRecords, record: HookRecord, name: str, returncode: int, limits: Callable[[str], str]
) -> None:
    """`limits` adds to a failure's message the limits the hook hit."""
    if returncode == 0:
        _finish(records, record, "succeeded", 0, None)
    elif returncode < 0:
        _finish(records, record, "failed", None, limits(f"{name} exited via signal {signal.Signals(-returncode).name}"))
    else:
        _finish(records, record, "failed", returncode, limits(f"{name} failed with exit code {returncode}"))


def _finish(
    records: HookRecords, record: HookRecord, outcome: HookOutcomeStatus, exit_code: int | None, message: str | None
) -> None:
    record.outcome = outcome
    record.exit_code = exit_code
    record.message = message
    record.finished_at = now_iso()
    _write_outcome(records, record)


def _write_outcome(records: HookRecords, record: HookRecord) -> None:
    """Write the finished record, however long the disk refuses it for lack of space."""
    delay, held = RECORD_RETRY_FIRST_S, None
    try:
        while True:
            try:
                records.write(record)
                return
            except OSError as error:
                if error.errno not in OUT_OF_SPACE:
                    raise
            if held is None:
                held = HeldOutcome(records, record)
            held.hand_out_for(delay)
            delay = min(2 * delay, RECORD_RETRY_MAX_S)
    finally:
        if held is not None:
            held.close()


if __name__ == "__main__":
    # As subprocess's close_fds would: the script inherits nothing but its standard streams.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    main()
