"""Hosts and their agents (SPEC 7.1): a registered host's work runs in its agent, a process of its
own that shares nothing with the service but the bus, and waits for it while it is away."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import Error as NatsError

from bb_environments.bus.access import (
    SERVICE_INBOX_PREFIX,
    Credentials,
    host_agent_inbox_prefix,
    new_seed,
    seed_public_key,
)
from bb_environments.bus.health import BusHealth
from bb_environments.entrypoints.agent import CredentialsRefused, check_identity, credentials_refused
from tests.integration.conftest import Service, Violations, eventually, service_environment, write_hooks
from tests.integration.host_agents import Agent, machines, python_for, register, running_agent
from tests.support.os_users import unprivileged_user


async def test_a_host_never_seen_waits_saying_so_and_its_agent_does_the_work_in_its_own_root(
    service: Service, git_repo: Path, tmp_path: Path
):
    marker = tmp_path / "hooks.log"
    write_hooks(git_repo, marker, setup="pwd > " + str(tmp_path / "setup-cwd"))
    credentials = Path((await register(service, "h1"))["credentials"])
    assert (await machines(service))["h1"]["status"] == "never-seen"

    environment_id = await service.spawn("git-worktree", project=git_repo, host="h1", thread_id="t1")
    waiting = await service.wait_for(environment_id, lambda e: "h1" in (e.get("statusMessage") or ""))
    assert waiting["status"] == "creating"
    assert "has not connected since it was registered" in waiting["statusMessage"]
    assert waiting["path"] is None and not marker.exists()

    agent = Agent(service, "h1", credentials, tmp_path / "h1")
    agent.start()
    try:
        ready = await service.wait_for(environment_id, "ready", timeout=30)
        assert ready["path"].startswith(str(agent.root) + "/"), ready
        assert (tmp_path / "setup-cwd").read_text().strip() == ready["path"]
        listed = (await machines(service))["h1"]
        assert (listed["status"], listed["environments"]) == ("online", 1)

        assert (await service.bb("thread", "archive", "t1")).returncode == 0
        await service.wait_for(environment_id, "removed")
        assert marker.read_text().split() == ["setup", "teardown"]
        assert not Path(ready["path"]).exists()
    finally:
        agent.stop()
    assert "Traceback" not in agent.log() + service.log_tail()


async def test_a_spawn_for_a_host_that_is_not_registered_is_refused_naming_the_registered_ones(service: Service):
    await register(service, "h1")
    refused = await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--host", "nowhere", "--json"
    )
    assert refused.returncode == 2
    message = refused.json()["error"]["message"]
    assert "'nowhere' is not registered" in message and "h1, local" in message
    assert (await service.bb("thread", "list", "--json")).json()["threads"] == []


async def test_the_hosts_an_earlier_release_registered_are_recorded_once_from_its_seed_files(tmp_path: Path):
    """An earlier release kept its registered hosts as seed files only: a start records each one the
    log never heard of, once, however many times it starts (after a kill -9 too); its agent's seed
    keeps working and its host takes environments."""
    data_dir = tmp_path / "data"
    seed = new_seed()
    seed_file = Credentials(data_dir / "credentials").register_host("h1", seed)
    service = Service(data_dir, service_environment(data_dir))
    await service.start()
    try:
        assert (await machines(service))["h1"]["status"] == "never-seen"
        service.kill()
        await service.start()
        agent = Agent(service, "h1", seed_file, tmp_path / "h1")
        agent.start()
        try:
            await agent.serving()
            environment_id = await service.spawn("personal-workspace", host="h1", thread_id="t1")
            await service.wait_for(environment_id, "ready")
        finally:
            agent.stop()
    finally:
        await service.stop()
    exported = await service.bb("events", "export")  # from the store itself, the service stopped
    registrations = [
        (event["hostId"], event["publicKey"])
        for event in map(json.loads, exported.stdout.splitlines())
        if event["type"] == "host_registered"
    ]
    assert registrations == [("h1", seed_public_key(seed))]


async def test_registering_twice_is_refused_and_a_rotation_shuts_the_old_seed_out_at_once(
    service: Service, tmp_path: Path
):
    async with running_agent(service, "h1", tmp_path / "h1") as agent:
        again = await service.bb("machine", "register", "h1", "--json")
        assert again.returncode == 2 and "--rotate" in again.json()["error"]["message"]
        old_seed = agent.credentials.read_text()
        old_copy = tmp_path / "old.nk"
        old_copy.write_text(old_seed)
        old_copy.chmod(0o600)

        rotated = await service.bb("machine", "register", "h1", "--rotate", "--json")
        assert rotated.returncode == 0, rotated.stderr
        assert agent.credentials.read_text() != old_seed
        with pytest.raises(NatsError):
            await nats.connect(
                service.info["natsUrl"],
                nkeys_seed=str(old_copy),
                max_reconnect_attempts=0,
                allow_reconnect=False,
                connect_timeout=5,
            )
        fresh = await nats.connect(
            service.info["natsUrl"], nkeys_seed=str(agent.credentials), inbox_prefix="_BB_HOST_INBOX.h1"
        )
        await fresh.close()
        assert await agent.died() == 1, "the agent whose seed was replaced ends, saying why"
        assert "the server refuses the credentials of host 'h1'" in agent.log()


async def test_removing_a_host_is_refused_while_it_holds_environments_then_its_seed_stops_working(
    service: Service, tmp_path: Path
):
    async with running_agent(service, "h1", tmp_path / "h1") as agent:
        environment_id = await service.spawn("personal-workspace", host="h1", thread_id="t1")
        await service.wait_for(environment_id, "ready")
        refused = await service.bb("machine", "remove", "h1", "--yes", "--json")
        assert refused.returncode == 1 and "1 environment" in refused.json()["error"]["message"]

        assert (await service.bb("thread", "archive", "t1")).returncode == 0
        await service.wait_for(environment_id, "removed")
        agents_copy = tmp_path / "h1-copy.nk"  # the agent's machine keeps the file it was given
        agents_copy.write_text(agent.credentials.read_text())
        removed = await service.bb("machine", "remove", "h1", "--yes", "--json")
        assert removed.returncode == 0, removed.stderr
        assert removed.json() == {"machineId": "h1", "status": "removed"}
        assert not agent.credentials.exists()
        with pytest.raises(NatsError):
            await nats.connect(
                service.info["natsUrl"],
                nkeys_seed=str(agents_copy),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=5,
            )
    assert "h1" not in await machines(service)
    again = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--host", "h1")
    assert again.returncode == 2


@pytest.mark.parametrize(
    "crash_at",
    ["agent-job-done#1", "agent-job-reported#1", "agent-job-done#2", "agent-job-reported#3", "agent-job-done#4"],
    ids=["create-returned", "create-reported", "setup-finished", "teardown-reported", "remove-returned"],
)
async def test_an_agent_killed_at_any_step_and_started_again_keeps_every_guarantee(
    service: Service, git_repo: Path, tmp_path: Path, crash_at: str
):
    """The agent's jobs for one environment come in order: create (1), setup (2), teardown (3), remove (4)."""
    marker = tmp_path / "hooks.log"
    write_hooks(git_repo, marker)
    credentials = Path((await register(service, "h1"))["credentials"])
    agent = Agent(service, "h1", credentials, tmp_path / "h1")
    agent.start(BB_CRASH_AT=crash_at)
    try:
        await agent.serving()
        environment_id = await service.spawn("git-worktree", project=git_repo, host="h1", thread_id="t1")
        crashed_before_ready = crash_at.endswith(("#1", "#2"))
        if crashed_before_ready:
            assert await agent.died() == -9
            agent.start()
        ready = await service.wait_for(environment_id, "ready", timeout=60)
        assert (await service.bb("thread", "archive", "t1")).returncode == 0
        if not crashed_before_ready:
            assert await agent.died() == -9
            agent.start()
        await service.wait_for(environment_id, "removed", timeout=60)
    finally:
        agent.stop()
    assert marker.read_text().split() == ["setup", "teardown"], "each hook ran exactly once"
    assert not Path(ready["path"]).exists()
    worktrees = [
        line
        for line in (await _git(git_repo, "worktree", "list", "--porcelain")).splitlines()
        if line.startswith("worktree ")
    ]
    assert worktrees == [f"worktree {git_repo}"], worktrees
    assert "Traceback" not in service.log_tail()


async def test_an_agent_killed_during_its_setup_joins_the_same_run_when_started_again(
    service: Service, git_repo: Path, tmp_path: Path
):
    hold, marker = tmp_path / "hold", tmp_path / "hooks.log"
    hold.touch()
    write_hooks(git_repo, marker, setup=f"while [ -e {hold} ]; do sleep 0.02; done")
    async with running_agent(service, "h1", tmp_path / "h1") as agent:
        environment_id = await service.spawn("git-worktree", project=git_repo, host="h1", thread_id="t1")
        await eventually(marker.exists, "the setup's start")
        agent.kill()
        agent.start()
        await agent.serving()
        hold.unlink()
        await service.wait_for(environment_id, "ready", timeout=60)
    assert marker.read_text().split() == ["setup"], "the setup was joined, not run again"


async def test_the_seed_of_one_host_reaches_nothing_but_that_hosts_own_work(service: Service, tmp_path: Path):
    """With h1's seed: no thread event, log, environment event, API request, nor anything of h2."""
    h1 = Path((await register(service, "h1"))["credentials"])
    await register(service, "h2")
    errors: list[str] = []

    async def record(error: Exception) -> None:
        errors.append(str(error).lower())

    nc = await nats.connect(
        service.info["natsUrl"], nkeys_seed=str(h1), inbox_prefix="_BB_HOST_INBOX.h1", error_cb=record
    )
    try:
        forbidden_publications = [
            "bb.threads.t9.created",
            "bb.log.environment.x.ready",
            "bb.environments.x.ready",
            "bb.hosts.h2.reports.x",
            "bb.hosts.h2.ledger",
            "bb.hosts.h2.secrets",
            "$KV.BB_HOSTS.h2",
            "$JS.API.CONSUMER.MSG.NEXT.BB_HOST_JOBS.host-h2",
            "bb.api.environments.list",
            "bb.placements.t9.ready",
            "$JS.API.STREAM.PURGE.BB_HOST_JOBS",
        ]
        for subject in forbidden_publications:
            await nc.publish(subject, b"{}")
        await nc.subscribe("bb.hosts.h2.>")
        await nc.subscribe("bb.threads.>")
        await nc.flush()
        for subject in [*forbidden_publications, "bb.hosts.h2.>", "bb.threads.>"]:
            await eventually(
                lambda: any(f'"{subject.lower()}"' in e for e in errors), f"the server refusing {subject}", timeout=10
            )
    finally:
        await nc.close()
    assert (await service.bb("thread", "list", "--json")).json()["threads"] == []


def _transcript_line(environment_id: str, text: str) -> bytes:
    return json.dumps(
        {
            "type": "transcript",
            "occurredAt": "2026-12-01T12:00:00Z",
            "environmentId": environment_id,
            "kind": "output",
            "source": "setup",
            "text": text,
        }
    ).encode()


async def test_an_agent_writes_transcript_lines_for_its_own_hosts_environments_only(
    service: Service, git_repo: Path, tmp_path: Path
):
    """With h2's seed, a line for h1's environment on every subject h2 can reach: the server refuses
    some, the core drops the rest, and none shows in `logs`, `show` or the stream; h1's own lines,
    written by its agent, and h2's own line of its own environment do."""
    from bb_environments.bus.wire import subjects

    write_hooks(git_repo, tmp_path / "hooks.log", setup="echo h1s-own-line")
    h2 = Path((await register(service, "h2"))["credentials"])
    async with running_agent(service, "h1", tmp_path / "h1"):
        h1_environment = await service.spawn("git-worktree", project=git_repo, host="h1")
        await service.wait_for(h1_environment, "ready")
    h2_environment = await service.spawn("personal-workspace", host="h2")
    await service.wait_for(h2_environment, lambda e: "h2" in (e.get("statusMessage") or ""))

    forged = "forged-by-h2"
    errors: list[str] = []

    async def record(error: Exception) -> None:
        errors.append(str(error).lower())

    nc = await nats.connect(
        service.info["natsUrl"], nkeys_seed=str(h2), inbox_prefix="_BB_HOST_INBOX.h2", error_cb=record
    )
    try:
        refused = [subjects.transcript(h1_environment), subjects.host_transcript("h1", h1_environment)]
        for subject in refused:
            await nc.publish(subject, _transcript_line(h1_environment, forged))
        # Taken in under h2's own subjects, where the core checks them: a line of h1's environment,
        # and one of h2's own environment naming h1's (the read model files a line by the one it names).
        js = nc.jetstream()
        for environment_id in (h1_environment, h2_environment):
            ack = await js.publish(
                subjects.host_transcript("h2", environment_id),
                _transcript_line(h1_environment, forged),
                headers={"Nats-Msg-Id": f"forged-{environment_id}"},
            )
            assert ack.stream == subjects.TRANSCRIPT_INTAKE_STREAM
        await js.publish(
            subjects.host_transcript("h2", h2_environment), _transcript_line(h2_environment, "h2s-own-line")
        )
        for subject in refused:
            await eventually(
                lambda: any(f'"{subject.lower()}"' in e for e in errors), f"the server refusing {subject}", timeout=10
            )
    finally:
        await nc.close()

    # The intake keeps its order: once h2's own line is in, the forged ones before it were judged.
    await service.wait_for(h2_environment, lambda e: "h2s-own-line" in json.dumps(e.get("transcript")))
    logs = await service.bb("environment", "logs", h1_environment)
    assert logs.returncode == 0, logs.stderr
    assert "h1s-own-line" in logs.stdout and forged not in logs.stdout, logs.stdout
    for environment_id in (h1_environment, h2_environment):
        shown = await service.bb("environment", "show", environment_id, "--json")
        assert shown.returncode == 0 and forged not in shown.stdout, shown.stdout
        stored = await service.bb("environment", "logs", environment_id, "--json")
        assert forged not in stored.stdout, stored.stdout
    assert "transcript line(s) of host(s) h2 for environments the log did not place on their host" in service.log_tail()


async def test_the_core_killed_between_keeping_an_agents_lines_and_taking_them_in_keeps_each_once(
    git_repo: Path, tmp_path: Path
):
    """kill -9 of the core after it kept a batch of the agent's lines in the transcripts and before it
    acknowledged them in the intake: started again, it keeps them again, and the stream stores each once."""
    hold = tmp_path / "hold-setup"
    hold.touch()
    write_hooks(
        git_repo,
        tmp_path / "hooks.log",
        setup=f"while [ -e {hold} ]; do sleep 0.02; done\nfor n in $(seq 1 50); do echo numbered-$n; done",
    )
    service = Service(tmp_path / "data", service_environment(tmp_path / "data"))
    await service.start()
    try:
        async with running_agent(service, "h1", tmp_path / "h1"):
            environment_id = await service.spawn("git-worktree", project=git_repo, host="h1")
            await eventually(lambda: (tmp_path / "hooks.log").exists(), "the setup starting")
            service.kill()  # started again to die at its next batch of kept lines: the setup's
            service.environment = service_environment(service.data_dir, BB_CRASH_AT="transcript-lines-kept")
            await service.start()
            hold.unlink()
            await eventually(lambda: service.process.poll() is not None, "the core's crash point", timeout=60)
            service.environment = service_environment(service.data_dir)
            await service.start()
            await service.wait_for(environment_id, "ready")
            await _intake_drained(service)  # the batch the crash left unacknowledged taken in again
            logged = await service.bb("environment", "logs", environment_id, "--json")
    finally:
        await service.stop()
    lines = [json.loads(line) for line in logged.stdout.splitlines()]
    texts = [line["text"] for line in lines]
    assert [text for text in texts if text.startswith("numbered-")] == [f"numbered-{n}" for n in range(1, 51)]
    stored = [(line["occurredAt"], line["text"]) for line in lines]
    assert len(stored) == len(set(stored)), f"a line stored twice: {texts}"


async def _intake_drained(service: Service) -> None:
    from bb_environments.bus.wire import subjects

    nc = await service.connect("service")
    try:
        js, deadline = nc.jetstream(), asyncio.get_running_loop().time() + 90
        while (await js.stream_info(subjects.TRANSCRIPT_INTAKE_STREAM)).state.messages:
            assert asyncio.get_running_loop().time() < deadline, "the intake still holds lines after 90 s"
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


async def test_a_forged_report_for_another_hosts_operation_changes_nothing(service: Service, tmp_path: Path):
    """h1 reports a create of an environment on h2 (waiting for its agent) on the only subjects it may
    publish on, its own: the environment goes on waiting, then gets h2's real workspace."""
    from bb_environments.bus.wire import subjects

    h1 = Path((await register(service, "h1"))["credentials"])
    h2 = Path((await register(service, "h2"))["credentials"])
    environment_id = await service.spawn("personal-workspace", host="h2", thread_id="t1")
    await service.wait_for(environment_id, lambda e: "h2" in (e.get("statusMessage") or ""))
    forged = {
        "job": "create",
        "operationId": f"{environment_id}.create.1",
        "result": {"status": "created", "path": "/tmp/forged", "ownsPath": True},
    }
    nc = await nats.connect(service.info["natsUrl"], nkeys_seed=str(h1), inbox_prefix="_BB_HOST_INBOX.h1")
    try:
        ack = await nc.jetstream().publish(
            subjects.host_report("h1", forged["operationId"]), json.dumps(forged).encode()
        )
        assert ack.stream == subjects.HOST_REPORTS_STREAM
    finally:
        await nc.close()
    agent = Agent(service, "h2", h2, tmp_path / "h2")
    agent.start()
    try:
        ready = await service.wait_for(environment_id, "ready", timeout=30)
    finally:
        agent.stop()
    assert ready["path"].startswith(str(agent.root) + "/") and ready["path"] != "/tmp/forged"


async def _git(repo: Path, *args: str) -> str:
    process = await asyncio.create_subprocess_exec("git", "-C", str(repo), *args, stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    return out.decode()


@pytest.fixture
def agent_user():
    """An unprivileged OS user of its own, and a directory it owns outside every test's 0700 tmp dir."""
    with unprivileged_user(f"bbagent{os.getpid()}") as account:
        home = Path(tempfile.mkdtemp(prefix="bb-agent-user-"))
        try:
            os.chown(home, account.pw_uid, account.pw_gid)
            python = python_for(account.pw_name, home)
            if python is None:
                pytest.skip(
                    f"the user {account.pw_name} can reach neither this venv's Python nor the system's of its version"
                )
            yield account, home, python
        finally:
            shutil.rmtree(home, ignore_errors=True)


async def test_an_agent_of_another_os_user_does_its_hosts_work_and_reads_nothing_of_the_core(
    service: Service, agent_user
):
    account, home, python = agent_user
    seed = home / "h1.nk"
    seed.write_text(Path((await register(service, "h1"))["credentials"]).read_text())
    os.chown(seed, account.pw_uid, account.pw_gid)
    seed.chmod(0o600)
    repo = home / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / ".bb-env-setup.sh").write_text(
        f"id -u > {home / 'setup-uid'}\n"
        f"cat {service.data_dir / 'credentials' / 'service.nk'} > {home / 'stolen'} || true\n"
    )
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo), "commit", "-qm", "setup"], check=True
    )
    subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", str(repo)], check=True)
    unreadable = subprocess.run(
        ["cat", str(service.data_dir / "credentials" / "service.nk")], user=account.pw_name, capture_output=True
    )
    assert unreadable.returncode != 0, "the agent's user must not read the core's data dir"

    agent = Agent(service, "h1", seed, home / "agent", user=account.pw_name, python=python)
    (home / "agent").mkdir()
    os.chown(home / "agent", account.pw_uid, account.pw_gid)
    agent.start()
    try:
        await agent.serving()
        personal = await service.spawn("personal-workspace", host="h1", thread_id="p1")
        worktree = await service.spawn("git-worktree", project=repo, host="h1", thread_id="w1")
        for environment_id in (personal, worktree):
            ready = await service.wait_for(environment_id, "ready", timeout=60)
            assert ready["path"].startswith(str(agent.root) + "/")
            assert os.stat(ready["path"]).st_uid == account.pw_uid
        assert (home / "setup-uid").read_text().strip() == str(account.pw_uid)
        assert (home / "stolen").read_text() == "", "the setup could not read the service's seed"
        for thread_id, environment_id in (("p1", personal), ("w1", worktree)):
            assert (await service.bb("thread", "archive", thread_id)).returncode == 0
            await service.wait_for(environment_id, "removed", timeout=60)
    finally:
        agent.stop()
    assert "Traceback" not in agent.log()


async def test_an_archive_while_the_host_is_away_waits_in_removing_with_its_claim_held(
    service: Service, tmp_path: Path
):
    async with running_agent(service, "h1", tmp_path / "h1") as agent:
        environment_id = await service.spawn("personal-workspace", host="h1", thread_id="t1")
        ready = await service.wait_for(environment_id, "ready")
        agent.kill()
        assert (await service.bb("thread", "archive", "t1")).returncode == 0
        waiting = await service.wait_for(
            environment_id, lambda e: "offline since" in (e.get("statusMessage") or ""), timeout=60
        )
        assert waiting["status"] == "removing" and Path(ready["path"]).exists()
        assert (await machines(service))["h1"]["status"] == "offline"
        agent.start()
        await service.wait_for(environment_id, "removed", timeout=30)
    assert not Path(ready["path"]).exists()


async def test_a_create_delivered_again_after_its_environment_was_removed_makes_no_workspace(
    service: Service, git_repo: Path, tmp_path: Path
):
    """A create job comes again once its environment was removed, as one does whose acknowledgement
    was lost while a NATS node was away (or one queued before its environment was cancelled and
    removed): the agent makes nothing, and says why."""
    from bb_environments.bus.wire import subjects

    core = await service.connect("service")
    queued: list[bytes] = []

    async def keep(message: Any) -> None:
        queued.append(message.data)

    try:
        await core.subscribe(subjects.host_jobs("h1"), cb=keep)
        async with running_agent(service, "h1", tmp_path / "h1"):
            environment_id = await service.spawn("git-worktree", project=git_repo, host="h1", thread_id="t1")
            ready = await service.wait_for(environment_id, "ready", timeout=60)
            assert (await service.bb("thread", "archive", "t1")).returncode == 0
            await service.wait_for(environment_id, "removed", timeout=60)
            operation_id = f"{environment_id}.create.1"
            create = next(job for job in queued if json.loads(job)["operationId"] == operation_id)

            reports = await core.subscribe(subjects.host_report("h1", operation_id))
            await core.jetstream().publish(
                subjects.host_job("h1", operation_id), create, headers={"Nats-Msg-Id": f"{operation_id}-again"}
            )
            report = json.loads((await reports.next_msg(timeout=30)).data)
    finally:
        await core.close()
    assert report["result"] == {
        "status": "failed",
        "failure": "terminal",
        "message": f"attempt 1 of environment {environment_id} was removed on this host; its workspace is not made again",
    }
    assert not Path(ready["path"]).exists()
    worktrees = [
        line
        for line in (await _git(git_repo, "worktree", "list", "--porcelain")).splitlines()
        if line.startswith("worktree ")
    ]
    assert worktrees == [f"worktree {git_repo}"], worktrees


async def test_the_same_path_on_two_hosts_is_two_claims(service: Service, git_repo: Path, tmp_path: Path):
    """A project checkout is claimed by its path on its host: the same path on another host is
    another machine's checkout, and holds no claim of the first's."""
    async with running_agent(service, "h1", tmp_path / "h1"), running_agent(service, "h2", tmp_path / "h2"):
        on_h1, on_h2 = [
            await service.spawn("project-checkout", project=git_repo, host=host_id, thread_id=f"t-{host_id}")
            for host_id in ("h1", "h2")
        ]
        first, second = await service.wait_for(on_h1, "ready"), await service.wait_for(on_h2, "ready")
        assert first["path"] == second["path"] == str(git_repo) and on_h1 != on_h2


async def test_serve_with_no_agent_leaves_its_own_hosts_work_to_a_bb_agent(tmp_path: Path):
    """`bb serve --no-agent`: its own host is no machine until `bb agent --host-id local` serves it
    (a spawn there is refused, not left waiting for good); from then on its environments are that agent's."""
    service = Service(tmp_path / "data", service_environment(tmp_path / "data"))
    await service.start("--no-agent")
    agent = Agent(service, "local", service.data_dir / "credentials" / "host-local.nk", tmp_path / "local")
    try:
        refused = await service.bb("thread", "spawn", "--environment-provider", "personal-workspace")
        assert refused.returncode == 2 and "own host 'local' has no agent" in refused.stderr, refused.stderr
        assert await machines(service) == {}
        agent.start()
        await agent.serving()
        environment_id = await service.spawn("personal-workspace", thread_id="t1")
        ready = await service.wait_for(environment_id, "ready", timeout=30)
    finally:
        agent.stop()
        await service.stop()
    assert ready["path"].startswith(str(agent.root) + "/")


async def test_bb_agent_root_moves_the_own_hosts_new_workspaces_out_of_the_data_dir_and_keeps_the_old_ones(
    service: Service, tmp_path: Path
):
    before = await service.spawn("personal-workspace", thread_id="t-before")
    old = await service.wait_for(before, "ready")
    assert old["path"].startswith(str(service.data_dir) + "/")
    await service.stop()
    root = tmp_path / "workspaces"
    service.environment["BB_AGENT_ROOT"] = str(root)
    await service.start()

    after = await service.spawn("personal-workspace", thread_id="t-after")
    new = await service.wait_for(after, "ready")
    assert new["path"].startswith(str(root) + "/")
    assert oct(service.data_dir.stat().st_mode & 0o777) == "0o700"
    for thread_id, environment_id in (("t-before", before), ("t-after", after)):
        assert (await service.bb("thread", "archive", thread_id)).returncode == 0
        await service.wait_for(environment_id, "removed")
    assert not Path(old["path"]).exists() and not Path(new["path"]).exists()


async def test_a_reply_the_server_refuses_after_the_agents_start_does_not_end_it_and_another_hosts_seed_does(
    service: Service,
):
    """Issue 29's nemesis: an agent paused past a reconnect answered a request it had taken before,
    on a node where the reply's permission no longer held, and ended as if its seed were another
    host's. Who the agent is, is settled at its start; a refused reply later ends nothing."""
    seeds = {host_id: str((await register(service, host_id))["credentials"]) for host_id in ("h1", "h2")}
    violations = Violations()
    agent = await nats.connect(
        service.info["natsUrl"],
        nkeys_seed=seeds["h1"],
        error_cb=violations.record,
        inbox_prefix=host_agent_inbox_prefix("h1"),
    )
    impostor = await nats.connect(
        service.info["natsUrl"],
        nkeys_seed=seeds["h2"],
        error_cb=Violations().record,
        inbox_prefix=host_agent_inbox_prefix("h1"),
    )
    try:
        await check_identity(agent, "h1", BusHealth())
        await agent.publish(f"{SERVICE_INBOX_PREFIX}.lapsed.1", b"{}")  # a reply whose permission lapsed
        await violations.wait_for("publish to")
        assert credentials_refused(agent, "h1") is None
        with pytest.raises(CredentialsRefused, match="does not let these credentials act for host 'h1'"):
            await check_identity(impostor, "h1", BusHealth())
    finally:
        await agent.close()
        await impostor.close()


async def test_an_agent_started_with_another_hosts_seed_or_no_seed_at_all_ends_saying_why(
    service: Service, tmp_path: Path
):
    await register(service, "h1")
    h2 = Path((await register(service, "h2"))["credentials"])
    wrong = Agent(service, "h1", h2, tmp_path / "wrong")
    wrong.start()
    assert await wrong.died() == 1
    assert "does not let these credentials act for host 'h1'" in wrong.log()
    garbage = tmp_path / "garbage.nk"
    garbage.write_text("not a seed\n")
    broken = Agent(service, "h1", garbage, tmp_path / "broken")
    broken.start()
    assert await broken.died() == 2
    assert "holds no NKEY seed" in broken.log() and "Traceback" not in broken.log()
