"""Warm pools (SPEC 10) with real processes: `bb serve`, its nats-server, git repositories and the
setup scripts, driven through `bb` as an operator would."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    Service,
    environment_events,
    eventually,
    lifecycle_types,
    service_environment,
    spawn_with_setup_held,
)
from tests.integration.host_agents import running_agent
from tests.integration.test_placements import publish

pytestmark = pytest.mark.asyncio

DEFAULT = {"branch": {"kind": "default"}}


def commit_setup(repo: Path, marker: Path, body: str = "") -> None:
    """A setup that records the workspace it ran in (one line per run) and what it made there."""
    (repo / ".bb-env-setup.sh").write_text(
        f'echo "$PWD" >> {marker}\necho "made at $(git rev-parse HEAD)" > made.txt\n{body}\n'
    )
    (repo / ".bb-env-teardown.sh").write_text(f'echo "teardown $PWD" >> {marker}\n')
    commit(repo, "hooks", ".bb-env-setup.sh", ".bb-env-teardown.sh")


def commit(repo: Path, message: str, *paths: str) -> str:
    if paths:
        subprocess.run(["git", "-C", str(repo), "add", *paths], check=True)
    subprocess.run(
        [
            "git",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@e",
            "-C",
            str(repo),
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            message,
        ],
        check=True,
    )
    return head(repo)


def head(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def worktrees(repo: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list", "--porcelain"], check=True, capture_output=True, text=True
    ).stdout
    return [line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")]


def setups(marker: Path) -> Counter[str]:
    lines = marker.read_text().splitlines() if marker.exists() else []
    return Counter(line for line in lines if not line.startswith("teardown "))


async def pools(service: Service) -> list[dict[str, Any]]:
    listed = await service.bb("pool", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return listed.json()["pools"]


async def pool_becomes(service: Service, what: str, check: Any, timeout: float = 60, which: int = 0) -> dict[str, Any]:
    """The pool `which` (in the order the pools were set) once `check` holds of it."""
    deadline = time.monotonic() + timeout
    while True:
        found = await pools(service)
        if len(found) > which and check(found[which]):
            return found[which]
        if time.monotonic() > deadline:
            raise AssertionError(f"the pool never became {what}: {found}")
        await asyncio.sleep(0.2)


async def a_round_of_refills(service: Service, tmp_path: Path) -> None:
    """Return once the refill has gone over every pool set so far: each round visits the pools in
    the order they were set, so the first member claimed for a pool of a new project, set now, marks
    a round that passed all the others after this call. For what a pool must not do meanwhile."""
    project = tmp_path / "a-round-of-refills"
    project.mkdir()
    subprocess.run(["git", "-C", str(project), "init", "-q", "-b", "main"], check=True)
    (project / "README.md").write_text("no setup here\n")
    commit(project, "initial", "README.md")
    await set_pool(service, project, 1)
    marker = len(await pools(service)) - 1
    await pool_becomes(service, "claimed a member", lambda p: sum(p["members"].values()) > 0, which=marker)


async def a_full_pool_of_two(service: Service, git_repo: Path, tmp_path: Path) -> Path:
    """A pool of two members set up and ready; the file its setups and teardowns write to."""
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    await set_pool(service, git_repo, 2)
    await pool_becomes(service, "full", lambda p: p["members"]["ready"] == 2)
    return marker


async def set_pool(service: Service, repo: Path, size: int, inputs: Any = None) -> dict[str, Any]:
    options = ["--inputs", json.dumps(inputs)] if inputs is not None else []
    done = await service.bb(
        "pool", "set", "--project", str(repo), "--provider", "git-worktree", "--size", str(size), *options, "--json"
    )
    assert done.returncode == 0, done.stderr
    return done.json()


async def spawn(
    service: Service, repo: Path, thread_id: str, inputs: Any = None, provider: str = "git-worktree"
) -> str:
    spawned = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        provider,
        "--project",
        str(repo),
        "--thread-id",
        thread_id,
        *(["--environment-inputs", json.dumps(inputs)] if inputs is not None else []),
        "--wait",
        "--json",
    )
    assert spawned.returncode == 0, spawned.stderr
    return spawned.json()["environmentId"]


def branch_of(path: str) -> str:
    return subprocess.run(
        ["git", "-C", path, "rev-parse", "--abbrev-ref", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


async def test_a_bound_thread_gets_the_members_setup_and_its_own_branch_without_a_setup(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    asked = {"branch": {"kind": "new", "name": "feature/pooled", "base": "main"}}
    await set_pool(service, git_repo, 1, {"branch": {"kind": "new", "name": "whatever", "base": "main"}})
    pool = await pool_becomes(service, "ready", lambda p: p["members"]["ready"] == 1)
    listed = await service.bb("environment", "list", "--json")
    (waiting,) = listed.json()["environments"]
    assert (waiting["poolId"], waiting["pooled"], waiting["threadIds"]) == (pool["id"], True, [])

    environment_id = await spawn(service, git_repo, "t-pooled", asked)

    events = await environment_events(service, environment_id)
    kinds = lifecycle_types(events)
    assert kinds[: kinds.index("bound")][-1] == "pooled"
    after = kinds[kinds.index("bound") + 1 :]
    assert after[-1] == "ready" and not any(k in after for k in ("created", "setup_started", "setup_succeeded"))
    bound = events[kinds.index("bound")]
    assert bound["threadId"] == "t-pooled" and bound["threadIds"] == ["t-pooled"]
    shown = await service.show(environment_id)
    assert (shown["poolId"], shown["pooled"]) == (pool["id"], False)
    assert branch_of(shown["path"]) == "feature/pooled"
    assert (Path(shown["path"]) / "made.txt").read_text().strip() == f"made at {head(git_repo)}"
    assert setups(marker)[shown["path"]] == 1
    # The pool prepares the member's replacement.
    await pool_becomes(service, "refilled", lambda p: p["members"]["ready"] == 1)


async def test_a_new_commit_or_setup_script_gives_the_next_thread_a_fresh_environment_and_refills(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    await set_pool(service, git_repo, 1)
    first = await pool_becomes(service, "ready", lambda p: p["members"]["ready"] == 1)
    assert first["baseCommit"] == head(git_repo)
    stale_paths = set(worktrees(git_repo)[1:])

    moved = commit(git_repo, "the base moves on")
    environment_id = await spawn(service, git_repo, "t-after-commit", DEFAULT)
    shown = await service.show(environment_id)
    assert (Path(shown["path"]) / "made.txt").read_text().strip() == f"made at {moved}"
    assert shown["path"] not in stale_paths
    await pool_becomes(
        service, "refilled at the new head", lambda p: p["baseCommit"] == moved and p["members"]["ready"] == 1
    )
    await eventually(lambda: not stale_paths & set(worktrees(git_repo)), "the stale member's removal")

    # Only the setup script changes (its content, in a new commit).
    commit_setup(git_repo, marker, "echo second-script > script.txt")
    environment_id = await spawn(service, git_repo, "t-after-script", DEFAULT)
    shown = await service.show(environment_id)
    assert (Path(shown["path"]) / "script.txt").read_text().strip() == "second-script"
    await pool_becomes(
        service,
        "refilled with the new script",
        lambda p: p["baseCommit"] == head(git_repo) and p["members"]["ready"] == 1,
    )
    assert all(count == 1 for count in setups(marker).values()), setups(marker)


@pytest.mark.parametrize("service", [{"BB_POOL_MAX_FAILURES": "2"}], indirect=True)
async def test_a_setup_that_always_fails_pauses_the_pool_and_threads_still_get_cold_environments(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker, "exit 3")
    await set_pool(service, git_repo, 1)
    paused = await pool_becomes(service, "paused", lambda p: p["paused"] is not None)
    assert "2 member setups failed in a row" in paused["paused"]["reason"] and paused["failures"] == 2
    await a_round_of_refills(service, tmp_path)  # a paused pool prepares nothing
    assert sum(setups(marker).values()) == 2

    spawned = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "t-cold",
        "--wait",
        "--json",
    )
    assert spawned.json()["status"] == "error"  # its own setup fails, as without a pool
    events = await environment_events(service, spawned.json()["environmentId"])
    assert "bound" not in lifecycle_types(events) and "setup_failed" in lifecycle_types(events)

    pool_id = paused["id"]
    resumed = await service.bb("pool", "resume", pool_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["paused"] is None and resumed.json()["failures"] == 0
    await pool_becomes(service, "paused again", lambda p: p["paused"] is not None)


async def test_the_refill_waits_while_a_threads_own_setup_runs(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    environment_id = await spawn_with_setup_held(service, git_repo, hold, tmp_path / "hooks")
    await set_pool(service, git_repo, 1)
    # The refill records the base it read before it decides whether to prepare a member now.
    await pool_becomes(service, "checked against its base", lambda p: p["baseCommit"] == head(git_repo))
    assert (await pools(service))[0]["members"] == {"ready": 0, "preparing": 0, "stale": 0}
    hold.unlink()
    await service.wait_for(environment_id, "ready")
    pool = await pool_becomes(service, "filled once the thread's setup ended", lambda p: p["members"]["ready"] == 1)
    exported = [json.loads(line) for line in (await service.bb("events", "export")).stdout.splitlines()]
    setup_ended = next(
        n for n, e in enumerate(exported) if e.get("environmentId") == environment_id and e["type"] == "setup_succeeded"
    )
    first_claim = next(n for n, e in enumerate(exported) if e["type"] == "claimed" and e.get("poolId") == pool["id"])
    assert setup_ended < first_claim  # no member was claimed while the thread's setup ran


async def test_the_branch_a_bound_members_removal_kept_is_no_orphan(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    commit_setup(git_repo, tmp_path / "setups")
    await set_pool(service, git_repo, 1)
    await pool_becomes(service, "ready", lambda p: p["members"]["ready"] == 1)
    environment_id = await spawn(service, git_repo, "t-kept")
    assert branch_of((await service.show(environment_id))["path"]) == "bb/t-kept"

    assert (await service.bb("thread", "archive", "t-kept")).returncode == 0
    deleted = await service.bb("environment", "delete", environment_id, "--wait")
    assert deleted.returncode == 0, deleted.stderr
    doctor = await service.bb("doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert doctor.json()["orphans"] == []


async def test_size_zero_removes_the_members_with_their_teardowns(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = await a_full_pool_of_two(service, git_repo, tmp_path)
    members = worktrees(git_repo)[1:]
    assert len(members) == 2

    await set_pool(service, git_repo, 0)
    await eventually(lambda: len(worktrees(git_repo)) == 1, "the members' removal", timeout=60)
    await pool_becomes(service, "empty", lambda p: p["members"] == {"ready": 0, "preparing": 0, "stale": 0})
    teardowns = [line for line in marker.read_text().splitlines() if line.startswith("teardown ")]
    assert sorted(teardowns) == sorted(f"teardown {path}" for path in members)
    assert all(not Path(path).exists() for path in members)
    branches = subprocess.run(
        ["git", "-C", str(git_repo), "branch", "--list", "bb/*"], capture_output=True, text=True, check=True
    )
    assert branches.stdout.strip() == ""


async def test_a_thread_asking_for_another_project_provider_or_inputs_never_gets_a_member(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(git_repo), str(other)], check=True)
    await set_pool(service, git_repo, 1)
    await pool_becomes(service, "ready", lambda p: p["members"]["ready"] == 1)

    asked = [
        (other, "git-worktree", DEFAULT),
        (git_repo, "git-worktree", {"branch": {"kind": "new", "name": "topic", "base": "main"}}),
        (git_repo, "project-checkout", None),
    ]
    for number, (project, provider, inputs) in enumerate(asked):
        environment_id = await spawn(service, project, f"t-other-{number}", inputs, provider)
        assert "bound" not in lifecycle_types(await environment_events(service, environment_id))
    assert (await pools(service))[0]["members"]["ready"] == 1


@pytest.mark.parametrize("service", [{"BB_MAX_LIVE_ENVIRONMENTS_PER_PROJECT": "2"}], indirect=True)
async def test_members_count_in_the_live_limits_and_give_way_to_a_threads_own_environment(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    await set_pool(service, git_repo, 3)
    full = await pool_becomes(service, "as full as the limit allows", lambda p: p["members"]["ready"] == 2)
    await a_round_of_refills(service, tmp_path)  # the third member stays out
    assert (await pools(service))[0]["members"] == {"ready": 2, "preparing": 0, "stale": 0}, full

    # Another branch's thread gets a cold environment: a member makes room for it.
    environment_id = await spawn(service, git_repo, "t-cold", {"branch": {"kind": "new", "name": "topic"}})
    assert (await service.show(environment_id))["status"] == "ready"
    assert "bound" not in lifecycle_types(await environment_events(service, environment_id))
    await pool_becomes(service, "down to what the limit leaves", lambda p: p["members"]["ready"] == 1)


async def test_bad_pool_settings_are_refused_and_change_nothing(service: Service, git_repo: Path) -> None:
    bad = [
        ("--size", "-1"),
        ("--size", "two"),
        ("--provider", "no-such-provider"),
        ("--provider", "project-checkout"),
        ("--inputs", "{not json"),
        ("--inputs", '{"branch": {"kind": "existing", "name": "main"}}'),
        ("--inputs", '{"color": "blue"}'),
    ]
    for option, value in bad:
        arguments = {"--project": str(git_repo), "--provider": "git-worktree", "--size": "1", option: value}
        refused = await service.bb("pool", "set", *[word for pair in arguments.items() for word in pair], "--json")
        assert refused.returncode == 2, (option, value, refused.stdout, refused.stderr)
        error = json.loads(refused.stdout or refused.stderr)
        assert error["error"]["code"] == "invalid_input", error
    assert await pools(service) == []
    exported = await service.bb("events", "export")
    assert '"pool_' not in exported.stdout


async def test_a_service_killed_while_threads_bind_binds_each_member_once(tmp_path: Path, git_repo: Path) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    service = Service(tmp_path / "data", service_environment(tmp_path / "data"))
    await service.start()
    try:
        await set_pool(service, git_repo, 3)
        await pool_becomes(service, "full", lambda p: p["members"]["ready"] == 3)
        await service.stop()
        # The second rename done on the host, not yet recorded: the service dies there.
        service.environment = service_environment(tmp_path / "data", BB_CRASH_AT="bind-returned#2")
        await service.start()
        threads = [f"t-burst-{n}" for n in range(5)]

        def spawns() -> list[Any]:
            return [
                service.bb(
                    "thread",
                    "spawn",
                    "--environment-provider",
                    "git-worktree",
                    "--project",
                    str(git_repo),
                    "--thread-id",
                    t,
                    "--json",
                )
                for t in threads
            ]

        await asyncio.gather(*spawns())
        await eventually(lambda: service.process.poll() is not None, "the crash at the second bind", timeout=60)
        service.environment = service_environment(tmp_path / "data")
        await service.start()
        # A spawn the crash cut off is sent again, as its caller would: one sent again changes nothing.
        await asyncio.gather(*spawns())
        placed = {}
        for thread_id in threads:
            thread = await service.wait_for_thread(thread_id, having="environmentId", timeout=60)
            placed[thread_id] = thread["environmentId"]
            await service.wait_for(thread["environmentId"], "ready", timeout=90)
        assert len(set(placed.values())) == len(threads)
        exported = [json.loads(line) for line in (await service.bb("events", "export")).stdout.splitlines()]
        bound = Counter(e["environmentId"] for e in exported if e["type"] == "bound")
        assert bound and all(count == 1 for count in bound.values()), bound
        assert all(count == 1 for count in setups(marker).values()), setups(marker)
        for thread_id, environment_id in placed.items():
            shown = await service.show(environment_id)
            expected = f"bb/{thread_id}"
            assert branch_of(shown["path"]) == expected
    finally:
        await service.stop()


async def test_a_pool_on_a_registered_host_is_prepared_and_bound_by_that_hosts_agent(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    async with running_agent(service, "h1", tmp_path / "h1") as agent:
        done = await service.bb(
            "pool",
            "set",
            "--project",
            str(git_repo),
            "--provider",
            "git-worktree",
            "--size",
            "1",
            "--host",
            "h1",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        assert done.json()["hostId"] == "h1"
        await pool_becomes(service, "ready on h1", lambda p: p["members"]["ready"] == 1)
        spawned = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(git_repo),
            "--host",
            "h1",
            "--thread-id",
            "t-remote",
            "--wait",
            "--json",
        )
        assert spawned.returncode == 0, spawned.stderr
        environment_id = spawned.json()["environmentId"]
        assert "bound" in lifecycle_types(await environment_events(service, environment_id))
        shown = await service.show(environment_id)
        assert shown["path"].startswith(str(agent.root) + "/")
        assert branch_of(shown["path"]) == "bb/t-remote"
        assert setups(marker)[shown["path"]] == 1
        await pool_becomes(service, "refilled on h1", lambda p: p["members"]["ready"] == 1)
    assert "Traceback" not in agent.log() + service.log_tail()


async def test_an_agent_killed_after_renaming_a_members_branch_binds_it_when_started_again(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    async with running_agent(service, "h1", tmp_path / "h1") as agent:
        done = await service.bb(
            "pool", "set", "--project", str(git_repo), "--provider", "git-worktree", "--size", "1", "--host", "h1"
        )
        assert done.returncode == 0, done.stderr
        await pool_becomes(service, "ready on h1", lambda p: p["members"]["ready"] == 1)
        agent.stop()
        agent.start(BB_CRASH_AT="bind-renamed")
        await eventually(lambda: agent.log().count("is serving from") == 2, "the agent's start again")
        spawned = await service.bb(
            "thread",
            "spawn",
            "--environment-provider",
            "git-worktree",
            "--project",
            str(git_repo),
            "--host",
            "h1",
            "--thread-id",
            "t-agent-killed",
            "--json",
        )
        assert spawned.returncode == 0, spawned.stderr
        environment_id = spawned.json()["environmentId"]
        assert await agent.died() != 0
        agent.start()
        ready = await service.wait_for(environment_id, "ready", timeout=60)
        assert branch_of(ready["path"]) == "bb/t-agent-killed"
        kinds = lifecycle_types(await environment_events(service, environment_id))
        assert kinds.count("bound") == 1 and kinds[-1] == "ready"
        assert setups(marker)[ready["path"]] == 1


async def test_a_burst_of_raw_thread_events_sent_twice_binds_each_member_once(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    # As publishers send them over NATS, each thread's events twice (a publisher's retry): the pool's
    # two members go to two threads at most, the rest get cold environments, every setup once.
    marker = await a_full_pool_of_two(service, git_repo, tmp_path)
    intent = {"type": "provider", "environmentProviderId": "git-worktree"}
    threads = [f"t-burst-{n}" for n in range(10)]

    async def sent(thread_id: str) -> None:
        for _ in range(2):
            await publish(service, thread_id, "created", projectPath=str(git_repo), environment=intent)
            await publish(service, thread_id, "message", text="go")

    await asyncio.gather(*(sent(thread_id) for thread_id in threads))

    placed = [await service.wait_for_thread(t, having="environmentId", timeout=90) for t in threads]
    environments = [thread["environmentId"] for thread in placed]
    assert len(set(environments)) == len(threads)
    for environment_id in environments:
        await service.wait_for(environment_id, "ready")
    bound: Counter[str] = Counter()
    for environment_id in environments:
        events = await environment_events(service, environment_id)
        bound.update(event["environmentId"] for event in events if event["type"] == "bound")
    assert 1 <= len(bound) <= 2 and set(bound.values()) == {1}
    paths = [(await service.show(environment_id))["path"] for environment_id in environments]
    assert all(setups(marker)[path] == 1 for path in paths)
