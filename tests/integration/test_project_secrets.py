"""A project's secrets (SPEC 11): set from stdin, given to its setup and teardown hooks as
variables, and found nowhere else: each copy of a hook's output shows `***`, the log records only
the name, and no client on the bus ever receives the value."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
from nats.js.errors import NotFoundError

from bb_environments.bus.access import host_agent_inbox_prefix
from bb_environments.bus.wire import subjects
from tests.integration.conftest import Result, Service, connect_as, eventually, service_environment, write_hooks
from tests.integration.host_agents import register, running_agent

SETUP = """\
printf 'token length %s\\n' "${#API_TOKEN}"
printf 'one write: %s\\n' "$API_TOKEN"
printf 'two writes: %s' "${API_TOKEN:0:9}"
sleep 0.3
printf '%s done\\n' "${API_TOKEN:9}"
"""
TEARDOWN = 'echo "teardown sees $API_TOKEN"'


def a_value() -> str:
    return f"tok-{uuid.uuid4().hex}"


async def bb_with_stdin(service: Service, stdin: str, *args: str) -> Result:
    process = await asyncio.create_subprocess_exec(
        *service.cli(),
        *args,
        env=service.environment,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    return Result(process.returncode or 0, out.decode(), err.decode())


async def set_secret(service: Service, project: Path, name: str, value: str) -> None:
    result = await bb_with_stdin(service, value + "\n", "secret", "set", "--project", str(project), name, "--json")
    assert result.returncode == 0, result.stderr
    assert value not in result.stdout + result.stderr


@contextlib.asynccontextmanager
async def tail(service: Service, *args: str) -> AsyncIterator[Path]:
    """`bb events tail ARGS` running meanwhile; yields the file its output goes to."""
    output = service.data_dir.parent / f"tail-{uuid.uuid4().hex[:8]}.out"
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [*service.cli(), "events", "tail", *args],
            env=service.environment,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    try:
        yield output
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def listening_clients(service: Service) -> AsyncIterator[list[bytes]]:
    """Every client role subscribed to `>` and to all it may read; yields what they received."""
    received: list[bytes] = []
    connections = []

    async def keep(message: nats.aio.msg.Msg) -> None:
        received.append(message.subject.encode() + b" " + message.data + repr(message.headers).encode())

    for role in ("operator", "publisher", "subscriber"):
        nc, violations = await connect_as(service, role)
        connections.append(nc)
        await nc.subscribe(">", cb=keep)
        await violations.wait_for('Subscription to ">"')
        for readable in (
            subjects.ENVIRONMENT_EVENTS,
            subjects.TRANSCRIPT_EVENTS,
            subjects.PLACEMENT_EVENTS,
            "_INBOX.>",
        ):
            await nc.subscribe(readable, cb=keep)
    try:
        yield received
    finally:
        for nc in connections:
            await nc.close()


async def stream_messages(service: Service) -> list[bytes]:
    """Every message every stream stores, read with the service's own user."""
    return await messages_stored(await service.connect("service"))


async def messages_stored(nc: nats.aio.client.Client) -> list[bytes]:
    """Every message every stream stores, read with `nc` (the service's user); closes it."""
    js = nc.jetstream()
    found = []
    try:
        for stream in await js.streams_info():
            if not stream.state.messages:
                continue
            for sequence in range(stream.state.first_seq, stream.state.last_seq + 1):
                with contextlib.suppress(NotFoundError):
                    message = await js.get_msg(stream.config.name, sequence)
                    found.append(
                        (message.subject or "").encode() + (message.data or b"") + repr(message.headers).encode()
                    )
    finally:
        await nc.close()
    return found


def files_holding(root: Path, value: str) -> list[str]:
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and value.encode() in path.read_bytes()
    )


async def test_a_secret_reaches_the_hooks_and_shows_as_stars_everywhere_else(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    write_hooks(git_repo, tmp_path / "hooks.log", setup=SETUP, teardown=TEARDOWN)
    value = a_value()
    await set_secret(service, git_repo, "API_TOKEN", value)

    async with (
        listening_clients(service) as received,
        tail(service, "--json") as events,
        tail(service, subjects.TRANSCRIPT_EVENTS, "--json") as transcripts,
    ):
        await eventually(lambda: events.exists() and transcripts.exists(), "the tails' start")
        environment_id = await service.spawn("git-worktree", project=git_repo)
        ready = await service.wait_for(environment_id, "ready")
        shown_json = (await service.bb("environment", "show", environment_id, "--json")).stdout
        shown = (await service.bb("environment", "show", environment_id)).stdout
        hook_output = (await service.bb("environment", "logs", environment_id, "--hook-output")).stdout
        thread_id = ready["threadIds"][0]
        assert (await service.bb("thread", "archive", thread_id)).returncode == 0
        removed = await service.wait_for(environment_id, "removed")
        await eventually(lambda: "teardown sees" in transcripts.read_text(), "the teardown's line in the tail")

    transcript = json.dumps(ready["transcript"])
    assert "one write: ***" in transcript and "two writes: *** done" in transcript, transcript
    assert f"token length {len(value)}" in json.dumps(ready["transcript"])  # the hook had it
    assert "teardown sees ***" in json.dumps(removed["transcript"])
    for copy in (shown_json, shown, hook_output, transcripts.read_text()):
        assert "***" in copy and value not in copy, copy
    assert value not in events.read_text()
    assert "two writes: *** done" in hook_output

    exported = (await service.bb("events", "export")).stdout
    assert value not in exported
    facts = [json.loads(line) for line in exported.splitlines() if '"secret_set"' in line]
    assert [(fact["name"], fact["projectPath"]) for fact in facts] == [("API_TOKEN", str(git_repo.resolve()))]
    assert all(value.encode() not in message for message in received)
    assert received  # the clients did hear the environment's events and transcript
    assert all(value.encode() not in message for message in await stream_messages(service))

    listed = await service.bb("secret", "list", "--project", str(git_repo), "--json")
    assert [s["name"] for s in listed.json()["secrets"]] == ["API_TOKEN"] and value not in listed.stdout
    await service.stop()  # everything it wrote is on disk
    assert files_holding(tmp_path, value) == [
        f"data/secrets/{name}" for name in sorted(p.name for p in (service.data_dir / "secrets").iterdir())
    ]
    store = next((service.data_dir / "secrets").iterdir())
    assert oct(store.stat().st_mode & 0o777) == "0o600"
    assert oct((service.data_dir / "secrets").stat().st_mode & 0o777) == "0o700"
    assert value not in service.log_tail()

    await service.start()  # a restart keeps the secret, and the next hook gets it
    again = await service.spawn("git-worktree", project=git_repo)
    ready_again = await service.wait_for(again, "ready")
    assert f"token length {len(value)}" in json.dumps(ready_again["transcript"])
    removed_secret = await service.bb("secret", "remove", "--project", str(git_repo), "API_TOKEN", "--json")
    assert removed_secret.returncode == 0, removed_secret.stderr
    assert (await service.bb("secret", "list", "--project", str(git_repo), "--json")).json()["secrets"] == []
    assert files_holding(service.data_dir, value) == []


async def test_a_hook_run_by_a_hosts_agent_gets_the_secret_over_its_own_inbox_only(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    write_hooks(git_repo, tmp_path / "hooks.log", setup=SETUP)
    value = a_value()
    await set_secret(service, git_repo, "API_TOKEN", value)
    async with running_agent(service, "h1", tmp_path / "h1") as agent, listening_clients(service) as received:
        environment_id = await service.spawn("git-worktree", project=git_repo, host="h1")
        ready = await service.wait_for(environment_id, "ready")
        transcript = json.dumps(ready["transcript"])
        assert f"token length {len(value)}" in transcript and "two writes: *** done" in transcript
        assert value not in transcript
        assert all(value.encode() not in message for message in received)
        assert all(value.encode() not in message for message in await stream_messages(service))
        assert files_holding(agent.base, value) == []
    assert "Traceback" not in agent.log()


async def test_a_value_on_argv_a_bad_name_or_an_unknown_project_is_refused_and_nothing_is_stored(
    tmp_path: Path, git_repo: Path
) -> None:
    roots = tmp_path / "projects"
    inside = roots / "repo"
    roots.mkdir()
    subprocess.run(["git", "clone", "-q", str(git_repo), str(inside)], check=True)
    (tmp_path / "plain").mkdir()
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_PROJECT_ROOTS=str(roots)))
    await service.start()
    try:
        on_argv = await bb_with_stdin(
            service, "", "secret", "set", "--project", str(inside), "API_TOKEN", "--value", "hunter2"
        )
        assert on_argv.returncode == 2 and "stdin" in on_argv.stderr, on_argv
        for name, said in (
            ("1TOKEN", "not allowed"),
            ("BB_TOKEN", "not starting with BB_"),
            ("API-TOKEN", "letters, digits and '_'"),
        ):
            refused = await bb_with_stdin(service, "hunter2", "secret", "set", "--project", str(inside), name)
            assert refused.returncode == 2 and said in refused.stderr, refused
        for project, said in (
            (tmp_path / "plain", "is outside BB_PROJECT_ROOTS"),
            (roots, "is not a git repository"),
            (roots / "missing", "is not a directory"),
        ):
            refused = await bb_with_stdin(service, "hunter2", "secret", "set", "--project", str(project), "API_TOKEN")
            assert refused.returncode == 2 and said in refused.stderr, refused
        empty = await bb_with_stdin(service, "", "secret", "set", "--project", str(inside), "API_TOKEN")
        assert empty.returncode == 2 and "stdin" in empty.stderr, empty

        assert (await service.bb("secret", "list", "--project", str(inside), "--json")).json()["secrets"] == []
        assert '"secret_set"' not in (await service.bb("events", "export")).stdout
        assert not (service.data_dir / "secrets").exists() or not any((service.data_dir / "secrets").iterdir())
        assert files_holding(tmp_path / "data", "hunter2") == []
    finally:
        await service.stop()


async def test_removing_a_secret_that_is_not_set_says_which_are(service: Service, git_repo: Path) -> None:
    await set_secret(service, git_repo, "OTHER", a_value())
    missing = await service.bb("secret", "remove", "--project", str(git_repo), "API_TOKEN")
    assert missing.returncode == 3 and "OTHER" in missing.stderr, missing


async def test_the_core_answers_a_question_for_secrets_only_onto_the_asking_agents_own_inbox(
    service: Service, tmp_path: Path
) -> None:
    credentials = (await register(service, "h1"))["credentials"]
    inbox = host_agent_inbox_prefix("h1")
    agent = await nats.connect(service.info["natsUrl"], nkeys_seed=credentials, inbox_prefix=inbox)
    try:
        elsewhere: list[bytes] = []
        answered: list[bytes] = []

        async def keep_elsewhere(message: nats.aio.msg.Msg) -> None:
            elsewhere.append(message.data)

        async def keep_answer(message: nats.aio.msg.Msg) -> None:
            answered.append(message.data)

        await agent.subscribe(subjects.host_hooks("h1", "stolen"), cb=keep_elsewhere)
        await agent.subscribe(f"{inbox}.asked", cb=keep_answer)
        question = json.dumps({"operationId": "e.setup.1"}).encode()
        await agent.publish(subjects.host_secrets("h1"), question, reply=subjects.host_hooks("h1", "stolen"))
        await agent.publish(subjects.host_secrets("h1"), question, reply=f"{inbox}.asked")
        # One subscription of the core answers both, in order: once the second is answered, the
        # first was decided.
        await eventually(lambda: bool(answered), "the answer on the agent's own inbox")
        assert json.loads(answered[0]) == {"secrets": {}}  # the log awaits no such hook
        await agent.flush()
        assert elsewhere == []
    finally:
        await agent.close()


async def test_a_kill_between_the_store_and_the_log_gives_no_hook_a_value_the_log_does_not_name(
    tmp_path: Path, git_repo: Path
) -> None:
    write_hooks(git_repo, tmp_path / "hooks.log", setup='echo "has token: ${API_TOKEN:+yes}"')
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_CRASH_AT="secret-stored"))
    await service.start()
    try:
        value = a_value()
        lost = await bb_with_stdin(service, value, "secret", "set", "--project", str(git_repo), "API_TOKEN")
        assert lost.returncode != 0
        await eventually(lambda: service.process.poll() is not None, "the service's crash point")
        service.environment |= {"BB_CRASH_AT": "secret-value-deleted"}
        await service.start()
        listed = await service.bb("secret", "list", "--project", str(git_repo), "--json")
        assert listed.json()["secrets"] == []  # its name never reached the log
        first = await service.spawn("git-worktree", project=git_repo)
        transcript = json.dumps((await service.wait_for(first, "ready"))["transcript"])
        assert "has token: " in transcript and "has token: yes" not in transcript

        await set_secret(service, git_repo, "API_TOKEN", value)  # set again: recorded this time
        again = await service.bb("secret", "remove", "--project", str(git_repo), "API_TOKEN")
        assert again.returncode != 0
        await eventually(lambda: service.process.poll() is not None, "the service's crash point")
        service.environment |= {"BB_CRASH_AT": ""}
        await service.start()
        assert [
            s["name"]
            for s in (await service.bb("secret", "list", "--project", str(git_repo), "--json")).json()["secrets"]
        ] == ["API_TOKEN"]
        second = await service.spawn("git-worktree", project=git_repo)
        assert "has token: yes" not in json.dumps((await service.wait_for(second, "ready"))["transcript"])
        removed = await service.bb("secret", "remove", "--project", str(git_repo), "API_TOKEN")
        assert removed.returncode == 0, removed.stderr  # removing again finishes the job
        assert (await service.bb("secret", "list", "--project", str(git_repo), "--json")).json()["secrets"] == []
        assert files_holding(tmp_path / "data", value) == []
    finally:
        await service.stop()
