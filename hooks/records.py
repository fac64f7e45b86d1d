"""Durable per-operation records of hook runs, their tombstones and output logs.

One directory (mode 0700) holds, per operation, files named by sha256(operation_id):
`<hash>.json` the record, `<hash>.cancelled` the tombstone, `<hash>.log` the script's output,
each in the shard directory named by the hash's first two hex digits (`ab/ab12….json`), so that
no directory holds more than a 256th of the operations a host keeps. A shard emptied by a
deletion is removed with it. An operation whose record or tombstone an earlier release wrote
straight into the directory (the flat layout) keeps all its files there: a supervisor of that
release may still be running and writes only there.
Records and tombstones are replaced atomically (a temporary file renamed over the old one), so a
reader never sees half a file, and a kill -9 of any process never loses a write that returned:
the kernel holds it. How they survive the machine going down is their sync level (`SyncLevel`,
`BB_HOOK_RECORD_SYNC`): `normal` gives that up, `full` fsyncs the file and its directory at
every write, two fsyncs per write, three writes per hook.

Standard library only: the supervisor and its launcher import this module.

Retention: an operation's files are deleted (`delete`) once the log says nothing will ask for them
again (see ledger.forget_removed); a record still unfinished on disk is never offered for that.

A recorded process (its supervisor, its script) is named by its pid and start time, and is known
again, signalled or killed with its group through providers/host/processes.py.

A supervisor whose outcome the disk refuses for lack of space holds it instead (`HeldOutcome`):
it listens on the operation's outcome address, a Unix socket in the abstract namespace (no file,
so no disk space needed), and hands the finished record to whoever connects until its write goes
through. Anyone can bind an abstract address, so a reader (`HookRecords.held_outcome`) believes
only the recorded supervisor itself, known by the socket's peer credentials, pid and start time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import select
import socket
import stat
import struct
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bb_environments.providers.host.processes import is_same_process

if TYPE_CHECKING:  # the launcher imports this module without site-packages: names for the checker only
    from bb_environments.domain.hook_operations import HookKind, HookOutcomeStatus

SyncLevel = Literal["normal", "full"]
SYNC_LEVELS: tuple[SyncLevel, ...] = ("normal", "full")

# Refusals that time cures (space freed on the disk, or under the quota): worth retrying forever.
OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
HELD_OUTCOME_TIMEOUT_S = 1.0
PEER_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
TEMPORARY_PREFIX = ".tmp-"  # what a record write begins as, until it is renamed into place
SHARD_DIGITS = 2
_SETTLING_SUFFIXES = (".json", ".cancelled")


class HookIdentityMismatch(Exception):
    """A stored record belongs to another operation, or the same operation was asked for a different hook."""


@dataclass(kw_only=True)
class HookRecord:
    operation_id: str
    kind: HookKind
    workspace: str
    script: str
    started_at: str
    supervisor_pid: int | None = None
    supervisor_started_at: int | None = None
    script_pid: int | None = None
    script_started_at: int | None = None
    finished_at: str | None = None
    outcome: HookOutcomeStatus | None = None
    exit_code: int | None = None
    message: str | None = None


@dataclass
class Tombstone:
    operation_id: str
    cancelled_at: str


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class HookRecords:
    def __init__(self, directory: Path, sync: SyncLevel = "normal") -> None:
        # Absolute: the supervisor changes into the workspace before it starts the script.
        self.directory = Path(directory).absolute()
        self.sync = sync
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Only when needed: a chmod is a metadata write even when it changes nothing.
        if stat.S_IMODE(os.stat(self.directory).st_mode) != 0o700:
            os.chmod(self.directory, 0o700)
        # Whether an earlier release's flat files may be here: only then is every lookup checked
        # against that layout too. Nothing writes a flat file anew, so one look is enough.
        with os.scandir(self.directory) as entries:
            self._flat_layout_seen = any(entry.is_file() for entry in entries)

    def read(self, operation_id: str) -> HookRecord | None:
        try:
            data = self._record_path(operation_id).read_bytes()
        except FileNotFoundError:
            return None
        if not data:
            # Only a power loss leaves one (its first write renamed in before its data reached the
            # disk, at the default sync level): the hook's start is as unknown as without a record.
            return None
        record = HookRecord(**json.loads(data))
        if record.operation_id != operation_id:
            raise HookIdentityMismatch(f"hook record for {operation_id!r} holds operation {record.operation_id!r}")
        return record

    def write(self, record: HookRecord) -> None:
        self._write_atomically(self._record_path(record.operation_id), _encode(record))

    def tombstone(self, operation_id: str) -> None:
        tombstone = Tombstone(operation_id=operation_id, cancelled_at=now_iso())
        self._write_atomically(self._file(operation_id, ".cancelled"), _encode(tombstone))

    def is_tombstoned(self, operation_id: str) -> bool:
        return self._file(operation_id, ".cancelled").exists()

    def log_path(self, operation_id: str) -> Path:
        return self._file(operation_id, ".log")

    def outcome_address(self, operation_id: str) -> bytes:
        """Where a supervisor holding the operation's unwritten outcome listens (see the module)."""
        # The directory is part of it: two services on one host may use the same operation ids.
        digest = hashlib.sha256(f"{self.directory}\0{operation_id}".encode()).hexdigest()
        return b"\0bb-hook-outcome/" + digest.encode()

    def held_outcome(self, record: HookRecord) -> HookRecord | None:
        """The finished record that `record`'s supervisor holds because it could not write it yet."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as connection:
            connection.settimeout(HELD_OUTCOME_TIMEOUT_S)
            try:
                connection.connect(self.outcome_address(record.operation_id))
                credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER_CREDENTIALS.size)
                peer_pid = PEER_CREDENTIALS.unpack(credentials)[0]
                if peer_pid != record.supervisor_pid or not is_same_process(peer_pid, record.supervisor_started_at):
                    return None
                data = _receive_until_closed(connection)
            except OSError:  # nobody holds it (the usual answer), or the holder just wrote it and left
                return None
        held = HookRecord(**json.loads(data))
        if held.operation_id != record.operation_id or held.finished_at is None:
            return None
        return held

    def settled_before(self, cutoff: datetime) -> list[str]:
        """Operations whose record finished, or whose tombstone (with no record) was written, before `cutoff`.

        Blocking. A file another process replaces or deletes meanwhile is skipped.
        """
        settled = []
        for path in self._stored_files(_SETTLING_SUFFIXES):
            # A record's last write is its outcome: one written since cannot have settled before.
            try:
                if path.stat().st_mtime >= cutoff.timestamp():
                    continue
                document = json.loads(path.read_bytes())
            except (FileNotFoundError, ValueError):
                continue
            operation_id = document.get("operation_id") if isinstance(document, dict) else None
            # Only a file that is its operation's own: deleting is by operation id.
            if not isinstance(operation_id, str) or self._file(operation_id, path.suffix) != path:
                continue
            if path.suffix == ".json":
                settled_at = document.get("finished_at")
            elif not path.with_suffix(".json").exists():
                settled_at = document.get("cancelled_at")
            else:
                continue  # the record decides
            if isinstance(settled_at, str) and _parsed_time(settled_at) < cutoff:
                settled.append(operation_id)
        return settled

    def delete_abandoned_writes(self, cutoff: datetime) -> None:
        """Delete the temporary files of record writes begun before `cutoff`. Blocking.

        A write holds its temporary file for the moment between creating and renaming it, so one
        that old was cut short by a crash and nobody will ever rename it.
        """
        temporaries = [*self.directory.glob(f"{TEMPORARY_PREFIX}*"), *self.directory.glob(f"*/{TEMPORARY_PREFIX}*")]
        for path in temporaries:
            try:
                if path.stat().st_mtime < cutoff.timestamp():
                    path.unlink()
            except FileNotFoundError:
                continue

    def delete(self, operation_ids: Iterable[str]) -> None:
        """Delete the operations' logs and tombstones, then their records. Blocking.

        In that order, with the directories synced in between: a crash at any point leaves at most
        a finished record without its log or tombstone, which reads as that outcome and is deleted
        by the next call, never a log or tombstone whose record is gone and which nothing looks for.
        Then the shards this emptied go.
        """
        operation_ids = list(operation_ids)
        if not operation_ids:
            return
        places = {self._place(operation_id) for operation_id in operation_ids}
        for operation_id in operation_ids:
            self.log_path(operation_id).unlink(missing_ok=True)
            self._file(operation_id, ".cancelled").unlink(missing_ok=True)
        for place in places:
            if place.exists():
                self._sync_directory(place)
        # Not synced: a record that a crash brings back is deleted again by the next call.
        for operation_id in operation_ids:
            self._record_path(operation_id).unlink(missing_ok=True)
        for place in places - {self.directory}:
            try:
                place.rmdir()
            except OSError:  # another operation's files are in it (ENOTEMPTY), or it is gone already
                pass

    def _record_path(self, operation_id: str) -> Path:
        return self._file(operation_id, ".json")

    def _file(self, operation_id: str, suffix: str) -> Path:
        return self._place(operation_id) / (_digest(operation_id) + suffix)

    def _place(self, operation_id: str) -> Path:
        """The directory of the operation's files: its shard, or the flat layout's for an operation
        an earlier release began there."""
        digest = _digest(operation_id)
        if self._flat_layout_seen and any(
            (self.directory / (digest + suffix)).exists() for suffix in _SETTLING_SUFFIXES
        ):
            return self.directory
        return self.directory / digest[:SHARD_DIGITS]

    def _stored_files(self, suffixes: tuple[str, ...]) -> Iterable[Path]:
        """The files with these suffixes in either layout. A shard removed meanwhile is skipped."""
        with os.scandir(self.directory) as entries:
            places = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        for place in [str(self.directory), *places]:
            try:
                with os.scandir(place) as entries:
                    found = [
                        Path(entry.path)
                        for entry in entries
                        if entry.name.endswith(suffixes) and entry.is_file(follow_symlinks=False)
                    ]
            except FileNotFoundError:
                continue
            yield from found

    def _write_atomically(self, path: Path, data: bytes) -> None:
        descriptor, temporary = self._temporary_beside(path)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
                if self.sync == "full":
                    file.flush()
                    os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        if self.sync == "full":
            self._sync_directory(path.parent)

    def _temporary_beside(self, path: Path) -> tuple[int, str]:
        """A new temporary file in `path`'s directory, which is made if missing (a new shard, or
        one a deletion of its last operation removed a moment ago)."""
        while True:
            try:
                return tempfile.mkstemp(dir=path.parent, prefix=TEMPORARY_PREFIX)
            except FileNotFoundError:
                path.parent.mkdir(mode=0o700, exist_ok=True)
                if self.sync == "full":
                    self._sync_directory(self.directory)  # which now names the shard

    def _sync_directory(self, path: Path) -> None:
        directory = os.open(path, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _digest(operation_id: str) -> str:
    return hashlib.sha256(operation_id.encode()).hexdigest()


def _parsed_time(text: str) -> datetime:
    """A time this module wrote (`now_iso`); anything else counts as now, which keeps its file."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return datetime.now(UTC)
    return parsed if parsed.tzinfo is not None else datetime.now(UTC)


def _encode(document: HookRecord | Tombstone) -> bytes:
    return json.dumps(asdict(document)).encode()


def _receive_until_closed(connection: socket.socket) -> bytes:
    chunks = []
    while chunk := connection.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


class HeldOutcome:
    """A supervisor's finished record that the disk refused, handed to whoever asks for it.

    If another process has bound the outcome address, nobody can be answered: the outcome then
    reaches its readers only once its write goes through.
    """

    def __init__(self, records: HookRecords, record: HookRecord) -> None:
        self._answer = _encode(record)
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._listener.bind(records.outcome_address(record.operation_id))
            self._listener.listen()
        except OSError:
            self._listener.close()
            self._listener = None

    def hand_out_for(self, seconds: float) -> None:
        """Answer whoever connects within the next `seconds`."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self._listener is None:
                time.sleep(remaining)
                return
            if select.select([self._listener], [], [], remaining)[0]:
                self._answer_one(self._listener)

    def _answer_one(self, listener: socket.socket) -> None:
        try:
            connection, _address = listener.accept()
        except OSError:
            return
        with connection:
            # A reader that stops reading must not keep the supervisor from its retries.
            connection.settimeout(HELD_OUTCOME_TIMEOUT_S)
            try:
                connection.sendall(self._answer)
            except OSError:
                pass

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
