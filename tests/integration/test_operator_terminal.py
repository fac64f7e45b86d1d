"""What an operator reads at the terminal, through the real CLI against a real `bb serve`: values as a
person reads them, refusals in the thread list, transcript text in events tail, tables within 80
columns, and the retire grace in force."""

from __future__ import annotations

import asyncio
import sys
import time

import msgspec
import pytest

from bb_environments.bus.wire import subjects
from tests.integration.conftest import Service, service_environment, write_hooks


async def test_show_prints_a_dash_for_nothing_and_yes_or_no_for_a_flag(service):
    spawned = (
        await service.bb(
            "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1", "--wait", "--json"
        )
    ).json()

    shown = await service.bb("environment", "show", spawned["environmentId"])

    assert shown.returncode == 0, shown.stderr
    fields = dict(
        line.strip().split(None, 1)
        for line in shown.stdout.splitlines()
        if line.startswith("  ") and not line.startswith("  │") and not line.startswith("  owns")
    )
    assert fields["project"] == "-" and fields["threads"] == "t1"
    assert [line.split()[-1] for line in shown.stdout.splitlines() if line.startswith("  owns path")] == ["yes"]
    assert "None" not in shown.stdout and "True" not in shown.stdout


@pytest.mark.parametrize("service", [{"BB_HOST_ID": "alpha"}], indirect=True)
async def test_thread_list_says_why_a_thread_was_refused(service):
    publisher = await service.connect("publisher")
    try:
        elsewhere = {"type": "existing", "hostId": "elsewhere"}  # a host this service does not serve
        created = {
            "type": "created",
            "occurredAt": "2026-11-30T12:00:00Z",
            "threadId": "refused",
            "environment": {"type": "provider", "environmentProviderId": "personal-workspace", "machine": elsewhere},
        }
        message = {"type": "message", "occurredAt": "2026-11-30T12:00:01Z", "threadId": "refused"}
        js = publisher.jetstream()
        await js.publish(subjects.thread_event("refused", "created"), msgspec.json.encode(created))
        await js.publish(subjects.thread_event("refused", "message"), msgspec.json.encode(message))  # placed here
    finally:
        await publisher.close()
    refusal = (await service.wait_for_thread("refused", having="refusal"))["refusal"]
    assert "'elsewhere' is not registered" in refusal, refusal

    listed = await service.bb("thread", "list")

    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["THREAD", "STATUS", "ENVIRONMENT", "PARENT", "REFUSAL"]
    shown = row.split(None, 4)[4]
    assert shown == refusal or (shown.endswith("…") and refusal.startswith(shown[:-1])), (shown, refusal)
    assert len(row) <= 80


async def test_events_tail_of_transcripts_prints_what_each_line_says(service):
    tail = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bb_environments.entrypoints.bb",
        "events",
        "tail",
        "bb.transcripts.>",
        env=service.environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        # Spawn until the tail (still starting up) has heard a transcript; each spawn is a new thread.
        deadline = time.monotonic() + 60
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            spawned = (
                await service.bb(
                    "thread",
                    "spawn",
                    "--environment-provider",
                    "personal-workspace",
                    "--thread-id",
                    f"t{attempt}",
                    "--wait",
                    "--json",
                )
            ).json()
            try:
                while True:
                    line = (await asyncio.wait_for(tail.stdout.readline(), 1)).decode()
                    # The core's step line; the provider's own ("Preparing personal workspace")
                    # comes from its host through the intake, and may be heard before it.
                    if spawned["environmentId"] in line and "(attempt 1)" in line:
                        # The time, the environment, what it says (whole in a pipe; wrapped on a terminal).
                        assert line.split("  ")[1:] == [
                            spawned["environmentId"],
                            "» Preparing Personal workspace (attempt 1)\n",
                        ], line
                        return
            except TimeoutError:
                continue
        raise AssertionError("events tail printed no transcript line's text")
    finally:
        tail.kill()
        await tail.wait()


async def test_the_listing_fits_80_columns_whatever_the_path_and_show_names_the_path_whole(tmp_path):
    data_dir = tmp_path / ("d" * 60) / "data"  # a personal workspace lies under it
    data_dir.parent.mkdir()
    service = Service(data_dir, service_environment(data_dir))
    await service.start()
    try:
        spawned = (
            await service.bb(
                "thread",
                "spawn",
                "--environment-provider",
                "personal-workspace",
                "--thread-id",
                "t1",
                "--wait",
                "--json",
            )
        ).json()
        shown = await service.show(spawned["environmentId"])
        assert len(shown["path"]) > 80

        listed = await service.bb("environment", "list")

        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert max(len(header), len(row)) <= 80
        environment_id, status, slug, thread, disk = row.split()
        assert (environment_id, status, thread) == (spawned["environmentId"], "ready", "t1")
        assert disk == "-" or disk[-1] in "BKMGT"  # not measured yet, or a size
        assert slug == shown["slug"] or (slug.startswith("…") and shown["slug"].endswith(slug[1:]))
        described = await service.bb("environment", "show", spawned["environmentId"])
        assert shown["path"] in described.stdout.replace("\n", "")
    finally:
        await service.stop()


async def test_providers_show_the_retire_grace_in_force(tmp_path):
    service = Service(tmp_path / "data", service_environment(tmp_path / "data", BB_RETIRE_GRACE_MS="1234"))
    await service.start()
    try:
        listed = await service.bb("environment", "providers")
        as_json = (await service.bb("environment", "providers", "--json")).json()
    finally:
        await service.stop()

    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert rows["personal-workspace"].endswith("1234 ms")  # declared: 300000 ms
    assert rows["project-checkout"].endswith("never")  # a provider that never retires still never does
    graces = {p["id"]: p["policy"]["retireGraceMs"] for p in as_json["providers"]}
    assert graces["personal-workspace"] == 1234 and graces["project-checkout"] is None


async def test_archiving_an_archived_thread_says_so_in_a_sentence(service):
    spawned = (
        await service.bb(
            "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1", "--wait", "--json"
        )
    ).json()
    first = await service.bb("thread", "archive", "t1")
    assert first.returncode == 0 and first.stdout.split()[0] == spawned["environmentId"], first.stdout

    again = await service.bb("thread", "archive", "t1")
    as_json = await service.bb("thread", "archive", "t1", "--json")

    assert again.returncode == 0, again.stderr
    assert again.stdout == "thread t1 is archived; no environment changed\n"
    assert as_json.json()["environmentId"] is None  # the JSON answer is as it was
    cancelled = await service.bb("thread", "cancel", "t1")
    assert cancelled.stdout == "thread t1 had no preparing environment of its own to cancel; nothing changed\n"


async def test_a_unique_start_of_an_environment_id_names_it_and_an_ambiguous_one_is_refused(service):
    # Seventeen environments: two of them begin with the same hex digit, whatever ids they drew.
    publisher = await service.connect("publisher")
    try:
        js = publisher.jetstream()
        for n in range(17):
            created = {
                "type": "created",
                "occurredAt": "2026-11-30T12:00:00Z",
                "threadId": f"t{n}",
                "environment": {"type": "provider", "environmentProviderId": "personal-workspace"},
            }
            message = {"type": "message", "occurredAt": "2026-11-30T12:00:01Z", "threadId": f"t{n}"}
            await js.publish(subjects.thread_event(f"t{n}", "created"), msgspec.json.encode(created))
            await js.publish(subjects.thread_event(f"t{n}", "message"), msgspec.json.encode(message))
    finally:
        await publisher.close()
    threads = {
        (await service.wait_for_thread(f"t{n}", having="environmentId"))["environmentId"]: f"t{n}" for n in range(17)
    }
    ids = sorted(threads)

    def unique_start(environment_id: str) -> str:
        return next(
            environment_id[:length]
            for length in range(1, 37)
            if sum(other.startswith(environment_id[:length]) for other in ids) == 1
        )

    chosen = ids[0]
    start = unique_start(chosen)
    shown = await service.bb("environment", "show", start.upper(), "--json")
    assert shown.returncode == 0, shown.stderr
    assert shown.json()["id"] == chosen
    history = await service.bb("environment", "history", start, "--json")
    assert history.returncode == 0 and history.json()["environmentId"] == chosen, history.stderr
    listed = (await service.bb("thread", "list", "--environment", start, "--json")).json()["threads"]
    assert [t["id"] for t in listed] == [threads[chosen]]
    deleted = await service.bb("environment", "delete", start)  # refused, for the environment the start names
    assert deleted.stderr == f"bb: environment {chosen} still serves threads {threads[chosen]}; archive them first\n"

    shared = next(digit for digit in "0123456789abcdef" if sum(i.startswith(digit) for i in ids) > 1)
    beginning = [i for i in ids if i.startswith(shared)]
    ambiguous = await service.bb("environment", "show", shared, "--json")
    assert ambiguous.returncode == 2, ambiguous.stderr
    said = ambiguous.json()["error"]["message"]
    assert f"environment id '{shared}' is ambiguous" in said, said
    assert all(i in said for i in beginning[:5]) and sum(i in said for i in ids) == min(len(beginning), 5), said
    assert ("and more" in said) == (len(beginning) > 5)

    absent = next(
        a + b for a in "0123456789abcdef" for b in "0123456789abcdef" if not any(i.startswith(a + b) for i in ids)
    )
    missing = await service.bb("environment", "retry", absent)
    assert missing.returncode == 3 and missing.stderr == f"bb: no environment id begins with '{absent}'\n"


async def test_retry_waits_with_the_transcript_for_the_setup_run_again(service, git_repo, tmp_path):
    tried = tmp_path / "tried"
    write_hooks(git_repo, tmp_path / "marker", setup=f"[ -e {tried} ] || {{ touch {tried}; echo no luck; exit 1; }}")
    failed = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "t1",
        "--wait",
    )
    # A person is told how it ended on stdout too, as with --json: the thread, its environment, `error`.
    assert failed.returncode == 1 and "no luck" in failed.stderr, failed.stderr
    thread_id, environment_id, status = failed.stdout.split()
    assert (thread_id, status) == ("t1", "error") and (await service.show(environment_id))["status"] == "error"

    retried = await service.bb("environment", "retry", environment_id[:8], "--wait", "--json")

    assert retried.returncode == 0, retried.stderr
    assert retried.json()["environmentId"] == environment_id and retried.json()["status"] == "ready"
    assert "» Running .bb-env-setup.sh" in retried.stderr and "preparing the workspace" in retried.stderr
    # Only what the retry printed: the first attempt's transcript was the spawn's to show.
    assert "no luck" not in retried.stderr and "Creating" not in retried.stderr, retried.stderr


@pytest.mark.parametrize("service", [{"BB_RETIRE_GRACE_MS": "600000"}], indirect=True)
async def test_delete_waits_until_the_environment_is_removed(service):
    spawned = (
        await service.bb(
            "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "t1", "--wait", "--json"
        )
    ).json()
    archived = await service.bb("thread", "archive", "t1", "--wait", "--timeout", "1", "--json")
    # Inside the grace the environment waits for a thread to come back: the wait is up, nothing failed.
    assert archived.returncode == 5, archived.stderr
    assert archived.json()["error"] == {
        "code": "timed_out",
        "message": f"environment {spawned['environmentId']} was still retiring after 1 s",
    }

    deleted = await service.bb("environment", "delete", spawned["environmentId"], "--wait")

    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == f"{spawned['environmentId']}  removed\n"
    assert (await service.show(spawned["environmentId"]))["status"] == "removed"
    again = await service.bb("environment", "delete", spawned["environmentId"])
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"environment {spawned['environmentId']} was removed already; nothing changed\n"
    as_json = await service.bb("environment", "delete", spawned["environmentId"], "--json")
    assert as_json.returncode == 0
    assert as_json.json()["environmentId"] == spawned["environmentId"] and as_json.json()["status"] == "removed"


async def test_archive_waits_until_the_last_threads_environment_is_removed(service, git_repo, tmp_path):
    write_hooks(git_repo, tmp_path / "marker", teardown="echo tearing down")
    spawned = (
        await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(git_repo),
            "--thread-id",
            "t1",
            "--wait",
            "--json",
        )
    ).json()

    archived = await service.bb("thread", "archive", "t1", "--wait", "--json")

    assert archived.returncode == 0, archived.stderr
    assert archived.json()["environmentId"] == spawned["environmentId"] and archived.json()["status"] == "removed"
    assert "tearing down" in archived.stderr
    again = await service.bb("thread", "archive", "t1", "--wait")  # nothing to wait for: said at once
    assert again.returncode == 0 and again.stdout == "thread t1 is archived; no environment changed\n"


async def test_a_spawn_wait_that_times_out_exits_5_not_as_a_failure(service, git_repo, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    write_hooks(git_repo, tmp_path / "marker", setup=f"while [ -e {hold} ]; do sleep 0.05; done")
    try:
        waited = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(git_repo),
            "--thread-id",
            "t1",
            "--wait",
            "--timeout",
            "1",
        )
    finally:
        hold.unlink()
    assert waited.returncode == 5, waited.stderr
    assert waited.stderr.splitlines()[-1].startswith("bb: environment ") and "after 1 s" in waited.stderr
