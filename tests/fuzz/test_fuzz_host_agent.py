"""Fuzz: the host agent runs no hook for any request the log does not back, whatever it is sent,
and refuses each in one log line that nobody can forge.

The seam is the handler the agent's micro service registers for each verb, handed a real
`nats.micro` Request, with the real host service behind it: its HookRunner on a temp dir and the
store-backed ledger over an SQLite log that recorded hook operations in every state a request
can aim at. Every directory a request can name holds hook scripts that would leave a marker.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import msgspec
from hypothesis import assume, given

from bb_environments.bus.wire.host_protocol import StartHook
from tests.fuzz.seams import (
    HostAgentWorld,
    LogLines,
    files_under,
    fuzz_settings,
    one_sentence,
    store_file,
    working_directory,
)
from tests.fuzz.strategies import CANARY, host_agent_requests


def names_what_the_log_awaits(data: bytes, awaited: set[tuple[str, str, uuid.UUID, str]]) -> bool:
    """A start naming an awaited operation exactly as recorded (in any spelling of the same
    environment and workspace) rightly runs its hook: the one request not to send."""
    try:
        start = msgspec.json.decode(data, type=StartHook)
        asked = (start.operation_id, start.kind, uuid.UUID(start.environment_id), os.path.realpath(start.workspace))
    except (msgspec.DecodeError, RecursionError, ValueError):
        return False
    return asked in awaited


def test_no_request_runs_a_hook_the_log_does_not_back(tmp_path: Path, micro, edge) -> None:
    world = HostAgentWorld(tmp_path, micro, edge)
    recorded = world.recorded
    awaited = {
        (r.operation_id, r.kind, uuid.UUID(r.environment_id), os.path.realpath(r.workspace))
        for r in recorded
        if r.awaited and r.host_id == "local"
    }
    # Cancelling what the log no longer waits for is allowed: it leaves a tombstone, and only that.
    tombstones = {hashlib.sha256(r.operation_id.encode()).hexdigest() + ".cancelled" for r in recorded if r.stoppable}
    operations = tuple(r.operation_id for r in recorded)
    workspaces = tuple(r.workspace for r in recorded) + tuple(world.planted)
    environment_ids = tuple(r.environment_id for r in recorded)
    head = world.head()

    def outside_hooks(path: str) -> bool:
        return store_file(path) or path.startswith(str(world.hooks_dir) + os.sep)

    files = files_under(tmp_path, outside_hooks)
    cwd_before = working_directory()
    try:

        @fuzz_settings()
        @given(host_agent_requests(operations, environment_ids, workspaces))
        def check(request: tuple[str, bytes]) -> None:
            subject, data = request
            verb = subject.rsplit(".", 1)[-1]
            assume(verb != "start" or not names_what_the_log_awaits(data, awaited))
            with LogLines().installed() as logs:
                reply = world.run(micro.ask(subject, data))
            for line in logs.lines():
                assert one_sentence(line) and CANARY not in line, line
            if verb == "start" or reply.code is not None:
                assert reply.code == "refused", (reply.code, reply.message)
                assert one_sentence(reply.message), reply.message
                assert len([line for line in logs.lines() if line.startswith("refused bb.hosts.local.hooks.")]) == 1
            else:
                msgspec.json.decode(reply.data)
            assert world.head() == head, "the host agent wrote to the log"
            # Every file under the records' shards (hooks/<2 hex digits>/...).
            hook_files = {p.name for p in world.hooks_dir.rglob("*") if p.is_file()}
            assert hook_files <= tombstones, f"a hook was recorded as started: {hook_files - tombstones}"
            assert not list(world.markers.iterdir()), "a hook ran"

        check()
        # No wait for a late marker is needed: a supervisor starts its script only once the runner
        # has written the hook's record, and every example found no record but cancellation tombstones.
        assert not list(world.markers.iterdir()), "a hook ran"
        assert files_under(tmp_path, outside_hooks) == files
        assert working_directory() == cwd_before
    finally:
        world.close()
