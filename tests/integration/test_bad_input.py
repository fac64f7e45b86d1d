"""Bad input is refused with a clear message and the SPEC's exit code, and changes nothing."""

from __future__ import annotations

import json
import subprocess
import uuid

import msgspec
import pytest

from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.api_messages import EnvironmentRef
from bb_environments.bus.wire.service_errors import ServiceError
from tests.integration.conftest import Service, service_environment


async def log_length(service) -> int:
    return len((await service.bb("events", "export")).stdout.splitlines())


async def log_and_threads(service) -> tuple[str, list[dict]]:
    """The whole event log and the thread list: a refusal must leave both as they were."""
    exported, listed = await service.bb("events", "export"), await service.bb("thread", "list", "--json")
    assert exported.returncode == listed.returncode == 0, (exported.stderr, listed.stderr)
    return exported.stdout, listed.json()["threads"]


def branches(repo) -> str:
    return subprocess.run(["git", "-C", str(repo), "branch", "--list"], capture_output=True, text=True).stdout


async def spawn_with(service, repo, *args: str):
    return await service.bb("thread", "spawn", "--project", str(repo), "--json", *args)


async def assert_refused(service, repo, args: tuple[str, ...], exit_code: int, *mentions: str) -> None:
    result = await spawn_with(service, repo, *args)
    assert result.returncode == exit_code, (args, result.stdout, result.stderr)
    error = result.json()["error"]
    for mention in mentions:
        assert mention in error["message"], (args, error)
    assert result.stderr.startswith("bb: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_bad_spawn_requests_exit_2_and_change_nothing(service, git_repo, tmp_path):
    good = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "good",
        "--wait",
    )  # a quiet log with something in it to compare
    assert good.returncode == 0, good.stderr
    await service.measured()
    length, before = await log_length(service), branches(git_repo)
    worktrees_root = service.data_dir / "providers" / "git-worktree" / "worktrees"
    existing = sorted(p.name for p in worktrees_root.iterdir())
    not_a_repo = tmp_path / "plain"
    not_a_repo.mkdir()

    cases = [
        (("--environment-provider", "nope"), "unknown environment provider 'nope'", "available: git-worktree"),
        (("--environment-inputs", "{}"), "--environment-provider"),
        (("--environment-provider", "git-worktree", "--environment-inputs", "{not json"), "not valid JSON"),
        (
            ("--environment-provider", "git-worktree", "--environment-inputs", '{"branch": {"kind": "sideways"}}'),
            "branch.kind",
            "sideways",
        ),
        (
            ("--environment-provider", "git-worktree", "--environment-inputs", '{"branch": {"kind": "new"}}'),
            "name",
            "branch",
        ),
        (("--environment-provider", "git-worktree", "--environment-inputs", '{"colour": "red"}'), "colour"),
        (
            (
                "--environment-provider",
                "git-worktree",
                "--environment-inputs",
                '{"branch": {"kind": "existing", "name": "ghost"}}',
            ),
            "ghost",
        ),
        (("--environment-provider", "git-worktree", "--thread-id", "../escape"), "thread id"),
        (("--environment-provider", "git-worktree", "--host", "elsewhere"), "'elsewhere' is not registered"),
        (("--environment-provider", "git-worktree", "--host", "--evil"), "host id"),
        (("--environment", "not-a-uuid"), "not a valid id"),
        (("--environment-provider", "git-worktree", "--environment", str(uuid.uuid4())), "either"),
    ]
    for malformed, mentions in [
        ("[" * 5000 + "]" * 5000, ("too deeply", "a few levels")),
        ('{"branch": {"kind": "new", "name": "x"}, "n": NaN}', ("NaN", "not a JSON number")),
        ('{"n": -Infinity}', ("-Infinity", "not a JSON number")),
        ('{"n": 1e999}', ("1e999", "too large")),
    ]:
        cases.append((("--environment-provider", "git-worktree", "--environment-inputs", malformed), *mentions))
    cases.append(
        (
            (
                "--environment-provider",
                "git-worktree",
                "--environment-inputs",
                '{"branch": {"kind": "new", "name": "refs/tags/v1"}}',
            ),
            "branch.name",
            "starts with 'refs/'",
        )
    )
    for hostile in ["--upload-pack=touch /tmp/pwned", "../x", "a..b", "has space", "x.lock", "", "a//b", "x@{1}"]:
        inputs = json.dumps({"branch": {"kind": "new", "name": hostile}})
        cases.append((("--environment-provider", "git-worktree", "--environment-inputs", inputs), "branch.name"))
    for args, *mentions in cases:
        await assert_refused(service, git_repo, args, 2, *mentions)

    refused = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(not_a_repo), "--json"
    )
    assert refused.returncode == 2 and "not a git repository" in refused.json()["error"]["message"]
    missing = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(tmp_path / "missing"), "--json"
    )
    assert missing.returncode == 2 and "not a directory" in missing.json()["error"]["message"]

    assert await log_length(service) == length
    assert branches(git_repo) == before
    assert sorted(p.name for p in worktrees_root.iterdir()) == existing
    assert not (tmp_path / "pwned").exists()


async def test_unknown_ids_exit_3_and_malformed_ids_exit_2(service):
    unknown = str(uuid.uuid4())
    for command in (
        ("environment", "show", unknown),
        ("environment", "delete", unknown),
        ("environment", "retry", unknown),
        ("thread", "spawn", "--environment", unknown),
        ("environment", "show", "123"),  # the start of an id, which no environment's begins
        ("thread", "archive", "no-such-thread"),
    ):
        result = await service.bb(*command, "--json")
        assert result.returncode == 3, (command, result.stderr)
        assert result.json()["error"]["code"] == "not_found"
    for command in (
        ("environment", "show", "12g"),
        ("environment", "delete", "x y"),
        ("thread", "list", "--environment", "zzz"),
    ):
        result = await service.bb(*command, "--json")
        assert result.returncode == 2, (command, result.stderr)


async def test_a_huge_id_is_refused_without_being_printed_back_whole(service):
    huge = "x" * 100_000
    for command in (("environment", "show", huge), ("thread", "archive", huge)):
        result = await service.bb(*command, "--json")
        assert result.returncode == 2, (command, result.stderr)
        message = result.json()["error"]["message"]
        assert f"{'x' * 100!r}… (100000 characters)" in message and len(message) < 400, message
    # The service names it the same way when a request reaches it.
    with pytest.raises(ServiceError) as refused:
        await service.api.call("environments", "show", EnvironmentRef(environment_id=huge))
    assert refused.value.code == "invalid_input" and len(str(refused.value)) < 400, refused.value


async def test_an_unreachable_service_exits_4_with_a_hint(tmp_path):
    nobody = Service(tmp_path / "empty", service_environment(tmp_path / "empty"))
    result = await nobody.bb("environment", "list", "--json")
    assert result.returncode == 4
    assert "bb serve" in result.json()["error"]["message"]
    assert result.stderr.count("\n") == 1 and "bb serve" in result.stderr

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "server.json").write_text('{"natsUrl": "nats://127.0.0.1:1", "pid": 1}')
    stale = await nobody.bb("environment", "list")
    assert stale.returncode == 4 and "bb serve" in stale.stderr


async def test_workspaces_in_bb_or_git_internals_are_refused_and_block_nothing(service, git_repo, tmp_path):
    data_dir = service.data_dir
    good = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "good",
        "--wait",
    )
    assert good.returncode == 0, good.stderr
    await service.measured()
    before = await log_and_threads(service)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a project\n")

    checkout = ("--environment-provider", "project-checkout")
    cases = [
        ("/", checkout, "workspace path '/' contains bb's data dir", "does not contain the data dir"),
        (data_dir, checkout, f"project path '{data_dir}' is bb's data dir", "outside it"),
        (data_dir / "providers", checkout, "is inside bb's data dir", "outside it"),
        (git_repo / ".git", checkout, "is inside a .git directory", "directory of the checkout itself"),
        (git_repo / ".git" / "refs", checkout, "is inside a .git directory"),
        (
            git_repo,
            (*checkout, "--environment-inputs", '{"path": ".git"}'),
            "workspace path",
            "inside a .git directory",
        ),
        (data_dir, ("--environment-provider", "git-worktree"), "is bb's data dir"),
        (git_repo / ".git", ("--environment-provider", "git-worktree"), "is inside a .git directory"),
        (a_file, checkout, f"project path '{a_file}' is not a directory"),
    ]
    for project, args, *mentions in cases:
        await assert_refused(service, project, args, 2, *mentions)

    assert await log_and_threads(service) == before
    # Nothing was claimed, so the checkout is free for the provider that asked for it.
    spawned = await service.bb("thread", "spawn", *checkout, "--project", str(git_repo), "--wait")
    assert spawned.returncode == 0, spawned.stderr


async def test_a_refused_spawn_leaves_no_thread_behind(service, git_repo, git):
    git(git_repo, "branch", "feature")
    holder = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "project-checkout",
        "--project",
        str(git_repo),
        "--thread-id",
        "holder",
        "--wait",
        "--json",
    )
    assert holder.returncode == 0, holder.stderr
    gone = await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "gone", "--wait", "--json"
    )
    await service.bb("thread", "archive", "gone")
    await service.wait_for(gone.json()["environmentId"], "removed")
    await service.measured()
    before = await log_and_threads(service)

    switch = '{"branch": {"kind": "existing", "name": "feature"}}'
    await assert_refused(
        service,
        git_repo,
        ("--environment-provider", "project-checkout", "--environment-inputs", switch, "--thread-id", "t2"),
        1,
        holder.json()["environmentId"],
    )
    await assert_refused(
        service,
        git_repo,
        ("--environment", gone.json()["environmentId"], "--thread-id", "t3"),
        1,
        "removed",
        "takes no new threads",
    )

    assert await log_and_threads(service) == before
    assert git(git_repo, "branch", "--show-current") == "main"
    again = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t2")
    assert again.returncode == 0, again.stderr  # the refused spawn did not take the thread id either


async def test_a_message_for_an_unknown_thread_is_logged_once_and_changes_nothing(service):
    publisher = await service.connect("publisher")
    try:
        js = publisher.jetstream()
        message = {"type": "message", "occurredAt": "2026-11-30T12:00:00Z", "threadId": "ghost", "text": "hello"}
        await js.publish(subjects.thread_event("ghost", "message"), msgspec.json.encode(message))
        await service.thread_events_handled()
    finally:
        await publisher.close()

    ghost_lines = [line for line in (service.data_dir.parent / "serve.log").read_text().splitlines() if "ghost" in line]
    assert len(ghost_lines) == 1 and "WARNING" in ghost_lines[0], ghost_lines
    assert "ignored a message for unknown thread ghost" in ghost_lines[0]
    exported, threads = await log_and_threads(service)
    assert threads == [] and "ghost" not in exported


async def test_usage_errors_exit_2_with_one_sentence_and_the_error_document_with_json(tmp_path):
    # Refused before any connection: no service is needed to answer them.
    nobody = Service(tmp_path / "data", service_environment(tmp_path / "data"))
    cases = [
        (("thread", "spawn", "--colour", "red"), "No such option '--colour'", "bb thread spawn --help"),
        (("environment", "show"), "Missing argument 'ENVIRONMENT_ID'", "bb environment show --help"),
        (
            ("thread", "spawn", "--timeout", "soon"),
            "Invalid value for '--timeout'",
            "'soon' is not a valid number of seconds",
        ),
        (("thread", "spawn", "--timeout", "-5"), "Invalid value for '--timeout'", "not in the range 0<x<=604800"),
        (("thread", "spawn", "--timeout", "0"), "Invalid value for '--timeout'", "not in the range"),
        (("thread", "spawn", "--timeout", "nan"), "Invalid value for '--timeout'", "'nan' is not a number of seconds"),
        (("events", "nonsense"), "No such command 'nonsense'", "bb events --help"),
        (("events", "tail", "bb.hosts.>"), "'bb.hosts.>' is not one events tail can follow", "bb.environments.>"),
        (("events", "tail", "bb.environments.>.ready"), "bb.transcripts.>"),
        (("events", "tail", "bb.environments"), "is not one events tail can follow"),
    ]
    for args, *mentions in cases:
        for as_json in (False, True):
            result = await nobody.bb(*args, *(["--json"] if as_json else []))
            assert result.returncode == 2, (args, result.stdout, result.stderr)
            assert result.stderr.startswith("bb: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert all(mention in result.stderr for mention in mentions), (mentions, result.stderr)
            if as_json:
                error = result.json()["error"]
                assert error["code"] == "invalid_input" and result.stderr == f"bb: {error['message']}\n"
            else:
                assert result.stdout == ""


@pytest.mark.parametrize("service", [{"BB_HOST_ID": "alpha"}], indirect=True)
async def test_a_thread_event_naming_another_machine_is_never_placed_here(service):
    """The intent's machine is where its environment runs: a host this service does not serve is
    refused on the thread, a machine that contradicts the thread's own host is refused outright,
    and a machine that names no host is the service's."""

    def created(thread_id: str, machine: dict, **fields: object) -> dict:
        intent = {"type": "provider", "environmentProviderId": "personal-workspace", "machine": machine}
        return {
            "type": "created",
            "occurredAt": "2026-11-30T12:00:00Z",
            "threadId": thread_id,
            "environment": intent,
            **fields,
        }

    elsewhere = {"type": "existing", "hostId": "elsewhere"}
    publisher = await service.connect("publisher")
    try:
        js = publisher.jetstream()
        for thread_id, body in (
            ("away", created("away", elsewhere)),
            ("torn", created("torn", elsewhere, hostId="alpha")),
            ("here", created("here", {"type": "existing"})),
        ):
            await js.publish(subjects.thread_event(thread_id, "created"), msgspec.json.encode(body))
            await js.publish(
                subjects.thread_event(thread_id, "message"),
                msgspec.json.encode({"type": "message", "occurredAt": "2026-11-30T12:00:01Z", "threadId": thread_id}),
            )
        await service.thread_events_handled()
    finally:
        await publisher.close()

    away, here = (await service.bb("thread", "list", "--json")).json()["threads"]
    assert away["id"] == "away" and away["environmentId"] is None
    assert "'elsewhere' is not registered" in away["refusal"], away
    environment = await service.wait_for(here["environmentId"], "ready")
    assert environment["hostId"] == "alpha"
    log = (service.data_dir.parent / "serve.log").read_text()
    assert (
        f"refused a thread event on {subjects.thread_event('torn', 'created')}: the thread names host 'alpha' "
        "but its environment intent names machine 'elsewhere'"
    ) in log
