"""`bb environment logs ENV [-f] [--json]` against a real `bb serve`: the environment's whole
transcript, then with -f each line as it is written, like `docker logs -f`."""

from __future__ import annotations

import asyncio
import json
import time

from tests.integration.conftest import Service, spawn_with_setup_held, write_hooks


async def test_logs_print_the_whole_transcript_and_as_json_lines(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "marker", setup="echo second line of setup")
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(git_repo), "--wait", "--json"
    )
    assert spawned.returncode == 0, spawned.stderr
    environment_id = spawned.json()["environmentId"]

    shown = await service.bb("environment", "logs", environment_id[:8])  # a start of the id will do
    assert shown.returncode == 0, shown.stderr
    texts = [line.split("  ", 1)[1] for line in shown.stdout.splitlines()]
    assert "  preparing the workspace" in texts and "  second line of setup" in texts, shown.stdout
    assert any(text.startswith("» ") for text in texts), shown.stdout  # the steps of the work, marked
    assert texts.index("  preparing the workspace") < texts.index("  second line of setup")

    as_json = await service.bb("environment", "logs", environment_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(lines) == len(texts)
    assert {
        "type": "transcript",
        "environmentId": environment_id,
        "kind": "output",
        "source": "setup",
        "text": "second line of setup",
    }.items() <= next(line for line in lines if line["text"] == "second line of setup").items()


async def test_logs_follow_prints_lines_as_the_hook_writes_them(service, git_repo, tmp_path):
    hold = tmp_path / "hold"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, tmp_path / "marker")
    following = await asyncio.create_subprocess_exec(
        *service.cli(),
        "environment",
        "logs",
        environment_id,
        "-f",
        "--json",
        env=service.environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert following.stdout is not None
        seen = await _line_saying(following, "preparing the workspace")  # written before the command started
        assert seen["source"] == "setup"
        hold.unlink()  # the held setup goes on, and ends
        await service.wait_for(environment_id, "ready")
        archived = await service.bb("thread", "archive", "t1", "--wait")
        assert archived.returncode == 0, archived.stderr
        removed = await _line_saying(following, "Removing worktree")  # written after the command started
        assert removed["kind"] == "step", removed
        assert following.returncode is None  # it follows until interrupted
    finally:
        if following.returncode is None:
            following.kill()
        await following.wait()


async def _line_saying(process: asyncio.subprocess.Process, fragment: str, timeout: float = 60) -> dict:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        try:
            raw = await asyncio.wait_for(process.stdout.readline(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(f"no line saying {fragment!r} within {timeout:.0f} s") from None
        assert raw, f"the logs ended before a line saying {fragment!r}"
        line = json.loads(raw)
        if fragment in line["text"]:
            return line


async def test_logs_of_an_unknown_environment_are_not_found(service: Service):
    shown = await service.bb("environment", "logs", "00000000-0000-4000-8000-000000000000")
    assert shown.returncode == 3 and "00000000-0000-4000-8000-000000000000" in shown.stderr, shown.stderr


async def test_the_json_of_streaming_commands_says_json_lines_and_of_waiting_ones_one_document(service: Service):
    for command in (("environment", "logs"), ("events", "tail"), ("events", "export")):
        helped = await service.bb(*command, "--help")
        assert "--json" in helped.stdout and "JSON lines" in " ".join(helped.stdout.split()), helped.stdout
    for command in (("thread", "spawn"), ("environment", "retry"), ("thread", "archive")):
        helped = " ".join((await service.bb(*command, "--help")).stdout.split())
        assert "one JSON document on stdout (with --wait, once the wait ends" in helped, helped


async def setup_lines(service: Service, environment_id: str) -> list[str]:
    """The texts of the setup hook's lines in the environment's transcript, in order."""
    shown = await service.bb("environment", "logs", environment_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return [line["text"] for line in map(json.loads, shown.stdout.splitlines()) if line["source"] == "setup"]


async def test_a_failed_hooks_last_line_comes_after_all_of_its_output(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "marker", setup="for i in $(seq 1 300); do echo line $i; done\nexit 3")
    spawned = await service.bb(
        "thread", "spawn", "--environment-provider", "git-worktree", "--project", str(git_repo), "--wait", "--json"
    )
    assert spawned.returncode == 1, spawned.stderr

    lines = await setup_lines(service, spawned.json()["environmentId"])

    assert lines[0] == "Running .bb-env-setup.sh"
    assert lines[-1] == ".bb-env-setup.sh failed: .bb-env-setup.sh failed with exit code 3", lines[-5:]
    assert lines[1:-1] == ["preparing the workspace", *(f"line {i}" for i in range(1, 301))]


async def test_a_hook_rejoined_after_a_restart_says_so_and_does_not_look_run_twice(service, git_repo, tmp_path):
    hold = tmp_path / "hold"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, tmp_path / "marker")
    deadline = time.monotonic() + 60
    # Killed once the hook's first line is out: else the restarted service is the first to say it.
    while "preparing the workspace" not in await setup_lines(service, environment_id):
        assert time.monotonic() < deadline, "the hook's first line never reached the transcript"
        await asyncio.sleep(0.1)
    service.kill()  # the hook's supervisor lives on, and so does the nats-server
    await service.start()
    rejoined = "Rejoined .bb-env-setup.sh, which kept running across a restart"
    deadline = time.monotonic() + 60
    while rejoined not in await setup_lines(service, environment_id):  # joined while it still runs
        assert time.monotonic() < deadline, "the restarted service never rejoined the hook"
        await asyncio.sleep(0.1)
    hold.unlink()
    await service.wait_for(environment_id, "ready")

    lines = await setup_lines(service, environment_id)

    assert lines == ["Running .bb-env-setup.sh", "preparing the workspace", rejoined, ".bb-env-setup.sh finished"]
    assert (tmp_path / "marker").read_text() == "setup\n"  # it ran once


async def test_a_spawn_waiting_across_a_restart_shows_each_line_of_the_rejoined_hook_once(service, git_repo, tmp_path):
    # The restarted service sends the rejoined hook's output again under the same ids: the stream
    # keeps each line once, and so does what `--wait` prints.
    hold, marker = tmp_path / "hold", tmp_path / "marker"
    hold.touch()
    write_hooks(git_repo, marker, setup=f"while [ -e {hold} ]; do sleep 0.02; done")
    waiting = asyncio.create_task(
        service.bb("thread", "spawn", "--environment-provider", "git-worktree", "--project", str(git_repo), "--wait")
    )
    deadline = time.monotonic() + 60
    while not (listed := (await service.bb("environment", "list", "--json")).json()["environments"]) or (
        "preparing the workspace" not in await setup_lines(service, listed[0]["id"])
    ):
        assert time.monotonic() < deadline and not waiting.done(), "the hook's first line never reached the transcript"
        await asyncio.sleep(0.1)
    service.kill()  # the hook's supervisor lives on, and so does the nats-server the spawn waits on
    await service.start()
    while "Rejoined .bb-env-setup.sh, which kept running across a restart" not in await setup_lines(
        service, listed[0]["id"]
    ):
        assert time.monotonic() < deadline, "the restarted service never rejoined the hook"
        await asyncio.sleep(0.1)
    hold.unlink()

    spawned = await waiting

    assert spawned.returncode == 0, spawned.stderr
    assert spawned.stderr.count("preparing the workspace") == 1, spawned.stderr


async def test_hook_output_prints_a_hooks_whole_output_from_its_hosts_records(service, git_repo, tmp_path):
    """The transcript keeps an environment's last 2000 lines; the host keeps a hook's whole output
    (up to BB_HOOK_OUTPUT_MAX_BYTES), which --hook-output pages through, on a host's agent too."""
    from tests.integration.host_agents import running_agent

    write_hooks(git_repo, tmp_path / "marker", setup='for i in $(seq 1 3000); do echo "line $i of many"; done')
    async with running_agent(service, "h1", tmp_path / "h1"):
        for host in ("local", "h1"):
            spawned = await service.bb(
                "thread",
                "spawn",
                "--environment-provider",
                "git-worktree",
                "--project",
                str(git_repo),
                "--host",
                host,
                "--thread-id",
                f"t-{host}",
                "--wait",
                "--json",
            )
            assert spawned.returncode == 0, spawned.stderr
            environment_id = spawned.json()["environmentId"]
            transcript = await service.bb("environment", "logs", environment_id)
            # The stream kept the environment's last 2000 lines only.
            assert "line 3000 of many" in transcript.stdout and "line 1 of many" not in transcript.stdout
            whole = await service.bb("environment", "logs", environment_id, "--hook-output")
            assert whole.returncode == 0, whole.stderr
            output = whole.stdout.splitlines()
            assert output[0].startswith("» setup (") and f"as host {host} keeps it" in output[0]
            assert [line for line in output if line.startswith("line ")] == [
                f"line {i} of many" for i in range(1, 3001)
            ]
            as_json = await service.bb("environment", "logs", environment_id, "--hook-output", "--json")
            pages = [json.loads(line) for line in as_json.stdout.splitlines()]
            assert "".join(p["text"] for p in pages).count(" of many\n") == 3000 and pages[0]["kind"] == "setup"

    unknown = await service.bb("environment", "logs", environment_id, "--hook-output", "--follow")
    assert unknown.returncode == 2 and "leave out --follow" in unknown.stderr
