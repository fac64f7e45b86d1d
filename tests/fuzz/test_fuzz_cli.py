"""Fuzz: with no service running, every `bb` command line ends in exit 2 (the input is bad) or 4
(the service is unreachable), in one sentence on stderr and, with --json, one error document on
stdout; never a traceback, never exit 1.

The seam is `run_cli`, what the `bb` console script runs, inside click's CliRunner isolation,
with BB_DATA_DIR at an empty temp dir. What the CLI can tell is wrong by itself (an id's format,
JSON, text that is not UTF-8, a number) must be exit 2; a command line drawn only from
well-meaning values must be exit 4; the rest (an unknown provider, say) is the service's to judge.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import uuid
from pathlib import Path

import msgspec
from click.testing import CliRunner
from hypothesis import example, given

from bb_environments.domain.ids import HOST_ID_PATTERN, ID_PATTERN
from bb_environments.entrypoints.cli import cli
from bb_environments.entrypoints.cli.support import run_cli
from tests.fuzz.seams import files_under, fuzz_settings, one_sentence, working_directory
from tests.fuzz.strategies import Invocation, cli_invocations

CODES = {2: "invalid_input", 4: "unreachable"}
ID = re.compile(ID_PATTERN)
HOST_ID = re.compile(HOST_ID_PATTERN)
ANY_ID = "3f2a9c1e-07bd-4c55-9e0b-5a1d2c3e4f60"


def carried_by_the_bus(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def a_json_document(text: str) -> bool:
    """JSON the bus can carry: no NaN or Infinity, no number too large for a double, no text
    that is not UTF-8, no nesting too deep for a reader to recurse through."""

    def refuse(_: str) -> float:
        raise ValueError

    def finite(number: str) -> float:
        if not math.isfinite(value := float(number)):
            raise ValueError
        return value

    try:
        msgspec.json.encode(json.loads(text, parse_constant=refuse, parse_float=finite))
    except (ValueError, RecursionError, UnicodeEncodeError):
        return False
    return True


def an_environment_id(text: str) -> bool:
    """A UUID, or the start of one as written (the service resolves it): completed by the rest
    of any id, it is an id in its written form."""
    try:
        uuid.UUID(text)
    except ValueError:
        if not text or len(text) >= len(ANY_ID):
            return False
        completed = text + ANY_ID[len(text) :]
        try:
            return str(uuid.UUID(completed)) == completed.lower()
        except ValueError:
            return False
    return True


def a_wait(text: str) -> bool:
    """More than 0 seconds and at most a week (NaN compares false both ways)."""
    try:
        return 0 < float(text) <= 7 * 24 * 3600
    except ValueError:
        return False


def format_problems(invocation: Invocation) -> list[str]:
    """What is wrong with the command line whatever the service would say: the CLI's to refuse."""
    options = dict(invocation.options)
    # The CLI sends a project as an absolute path: '\udcff/..' is a name that normalises away.
    sent = {name: os.path.abspath(value) if name == "--project" else value for name, value in options.items()}
    values = [*sent.values(), *([invocation.argument] if invocation.argument is not None else [])]
    problems = [f"{value!r} is not UTF-8 text" for value in values if not carried_by_the_bus(value)]
    if invocation.command == ("thread", "spawn"):
        if "--environment-inputs" in options and "--environment-provider" not in options:
            problems.append("inputs without a provider")
        if "--environment-inputs" in options and not a_json_document(options["--environment-inputs"]):
            problems.append("inputs that are not a JSON document")
        if "--environment" in options and not an_environment_id(options["--environment"]):
            problems.append("an environment id that is neither a UUID nor the start of one")
        problems += [
            f"{name} is not an id"
            for name, form in (("--thread-id", ID), ("--parent", ID), ("--host", HOST_ID))
            if name in options and not form.match(options[name])
        ]
        if "--timeout" in options and not a_wait(options["--timeout"]):
            problems.append("a timeout that is not a wait in seconds")
    elif invocation.argument is None:
        pass  # noise: whatever it is, click or the command refuses it
    elif invocation.command[0] == "environment" and not an_environment_id(invocation.argument):
        problems.append("an environment id that is neither a UUID nor the start of one")
    elif invocation.command[0] == "thread" and not ID.match(invocation.argument):
        problems.append("a thread id that is not an id")
    return problems


def test_every_command_line_exits_2_or_4_in_one_sentence(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    projects = tuple(str(p) for p in (tmp_path / "project", tmp_path / "project" / "sub"))
    Path(projects[1]).mkdir(parents=True)
    # No service, whatever the environment of the run says: only the empty data dir.
    environment = {name: None for name in os.environ if name.startswith(("BB_", "NATS_"))}
    environment["BB_DATA_DIR"] = str(data_dir)
    runner = CliRunner()
    cwd_before = working_directory()

    @fuzz_settings()
    @given(cli_invocations(projects))
    # Found by this test: ids of the wrong form and an empty --environment went to the service
    # (exit 4 here), text that is not UTF-8 crashed its encoding on the way out, a stray
    # argument's line break split the error, and `--prompt --json` took the prompt for the flag.
    @example(Invocation(("thread", "spawn"), (("--host", ""),), None, False, False, ("thread", "spawn", "--host=")))
    @example(Invocation(("thread", "archive"), (), "", True, False, ("thread", "archive", "", "--json")))
    @example(
        Invocation(
            ("thread", "spawn"), (("--environment", ""),), None, False, False, ("thread", "spawn", "--environment", "")
        )
    )
    @example(
        Invocation(
            ("thread", "spawn"),
            (("--environment-provider", "personal-workspace"), ("--prompt", "\udcff")),
            None,
            True,
            False,
            ("thread", "spawn", "--environment-provider", "personal-workspace", "--prompt", "\udcff", "--json"),
        )
    )
    @example(Invocation(("thread", "spawn"), (), None, False, False, ("thread", "spawn", "\n")))
    @example(
        Invocation(
            ("thread", "spawn"),
            (("--prompt", "--json"), ("--timeout", "abc")),
            None,
            False,
            False,
            ("thread", "spawn", "--prompt", "--json", "--timeout=abc"),
        )
    )
    def check(invocation: Invocation) -> None:
        with runner.isolation(env=environment) as (out, err, _):
            try:
                run_cli(cli, list(invocation.args))
            except SystemExit as exited:
                status = exited.code
            else:
                status = 0
            finally:
                # What click's isolation wraps around the byte buffers holds what print() wrote.
                sys.stdout.flush()
                sys.stderr.flush()
            stdout, stderr = out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace")

        assert status in CODES, (status, stderr)
        problems = format_problems(invocation)
        if problems:
            assert status == 2, (problems, stderr)
        elif invocation.clean:
            assert status == 4, stderr
        assert stderr.startswith("bb: ") and stderr.endswith("\n") and one_sentence(stderr[:-1]), stderr
        if invocation.as_json:
            error = json.loads(stdout)["error"]  # one document: a second would make this raise
            assert error["code"] == CODES[status] and one_sentence(error["message"]), error
        elif invocation.options or invocation.argument is not None:
            assert stdout == "", stdout
        assert files_under(data_dir) == set(), "a command wrote to the data dir of a service that is not there"

    check()
    assert working_directory() == cwd_before
