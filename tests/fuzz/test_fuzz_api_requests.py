"""Fuzz: every endpoint of the `bb-environments` API answers whatever it is sent, with an answer
or with a refusal a CLI user can read; a refusal writes nothing.

The seam is the micro-service handler `start_api` registers for each endpoint, handed a real
`nats.micro` Request, with the real Api behind it over an SQLite event store and read model
seeded with threads and environments the hostile ids aim at.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgspec
from hypothesis import example, given

from bb_environments.providers.registry import ProviderRegistry
from tests.fuzz.seams import LogLines, ServiceWorld, fuzz_settings, one_sentence, working_directory
from tests.fuzz.strategies import api_requests

REFUSALS = {"invalid_input", "not_found", "refused"}
"""`refused`: a well-formed request the state says no to (a blocked provider, a live environment)."""


def spawn(**fields: object) -> tuple[str, bytes]:
    return "bb.api.threads.spawn", json.dumps(fields).encode()


def test_no_api_request_fails_unexplained_or_is_written_when_refused(tmp_path: Path, micro, edge) -> None:
    world = ServiceWorld(tmp_path, ProviderRegistry.from_entry_points(), micro, edge)
    seeded = world.seeded
    plain, _, line_break = seeded.project_dirs
    cwd_before, seeded_files = working_directory(), world.files()

    @fuzz_settings()
    @given(
        api_requests(
            seeded.thread_ids, (seeded.ready_environment, seeded.removed_environment), seeded.project_dirs, world.head()
        )
    )
    # Found by this test: a field name with a line break split the error; a minPosition past the
    # log's end waited 10 s, then blamed the bus; a NUL in a project path failed with ValueError; a
    # line break in a project directory's name or in an inputs field split the error; a version past
    # what SQLite's integers hold failed the store's query.
    @example(("bb.api.environments.providers", b'{"t1\\n": 1}'))
    @example(
        (
            "bb.api.environments.show",
            json.dumps({"environmentId": seeded.ready_environment, "minPosition": world.head() + 1}).encode(),
        )
    )
    @example(
        ("bb.api.environments.show", json.dumps({"environmentId": seeded.ready_environment, "at": 2**63}).encode())
    )
    @example(
        (
            "bb.api.environments.history",
            json.dumps({"environmentId": seeded.ready_environment, "after": 2**63}).encode(),
        )
    )
    @example(spawn(parentThreadId="seeded-ready", projectPath=plain + "\x00"))
    @example(spawn(environmentProvider="git-worktree", projectPath=line_break))
    @example(spawn(environmentProvider="git-worktree", projectPath=plain, environmentInputs={"a\nb": 1}))
    def check(request: tuple[str, bytes]) -> None:
        subject, data = request
        head = world.head()
        with LogLines().installed() as logs:
            reply = world.run(micro.ask(subject, data))
            world.settle()
        assert not [r for r in logs.records if r.levelno >= logging.ERROR], logs.lines()
        if reply.code is not None:
            code, message = micro.api_error(reply)
            assert code == reply.code and code in REFUSALS, (code, message)
            assert one_sentence(message) and one_sentence(reply.message), message
            assert world.head() == head, "a refused request was written"
        else:
            msgspec.json.decode(reply.data)
        world.check_what_was_kept(head, seeded_files)

    try:
        check()
        assert working_directory() == cwd_before
        assert not list(world.markers.iterdir()), "a hook ran"
    finally:
        world.close()
