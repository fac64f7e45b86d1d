"""Spawn, list, show and delete through the same CLI for each local provider."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.integration.conftest import environment_events, lifecycle_types


async def spawn(service, *args: str):
    return await service.bb("thread", "spawn", "--json", *args)


async def test_providers_are_listed_with_inputs_schema_and_availability(service):
    listed = (await service.bb("environment", "providers", "--json")).json()["providers"]
    by_id = {p["id"]: p for p in listed}
    assert {"git-worktree", "project-checkout", "personal-workspace", "modal-sandbox"} <= set(by_id)
    assert by_id["git-worktree"]["availability"] == {"status": "ready", "reason": None}
    assert "branch" in by_id["project-checkout"]["inputs"]["$defs"]["ProjectCheckoutInputs"]["properties"]
    assert by_id["personal-workspace"]["inputs"] is None
    assert by_id["project-checkout"]["policy"]["retireGraceMs"] is None
    assert by_id["modal-sandbox"]["availability"]["status"] in ("ready", "blocked")


async def test_personal_workspace_is_shared_with_a_projectless_child_and_removed_after_the_last(service):
    parent = await spawn(service, "--environment-provider", "personal-workspace", "--thread-id", "p1", "--wait")
    assert parent.returncode == 0, parent.stderr
    environment_id = parent.json()["environmentId"]
    path = Path((await service.show(environment_id))["path"])
    assert path.is_dir() and (await service.show(environment_id))["ownsPath"] is True

    child = await spawn(service, "--parent", "p1", "--thread-id", "c1")
    assert child.returncode == 0, child.stderr
    assert child.json()["environmentId"] == environment_id

    await service.bb("thread", "archive", "p1")
    kept = await service.wait_for(environment_id, lambda e: e["threadIds"] == ["c1"])
    assert kept["status"] == "ready"
    await service.bb("thread", "archive", "c1")
    await service.wait_for(environment_id, "removed")
    assert not path.exists()


async def test_a_new_personal_workspace_is_ready_without_a_setup_hook_and_still_runs_its_teardown(service, tmp_path):
    """The directory is made empty, so no setup script can be there: the setup is skipped with the
    creation (no hook operation started). A teardown script put there later still runs."""
    spawned = await spawn(service, "--environment-provider", "personal-workspace", "--thread-id", "fresh", "--wait")
    assert spawned.returncode == 0, spawned.stderr
    shown = await service.show(spawned.json()["environmentId"])
    assert shown["status"] == "ready"
    assert shown["hooks"]["setup"] == {"status": "skipped", "operationId": None}
    await service.wait_for(
        shown["id"], lambda e: "» no .bb-env-setup.sh: the workspace was made empty" in e["transcript"]
    )
    types = lifecycle_types(await environment_events(service, shown["id"]))
    assert types == ["claimed", "created", "setup_skipped", "ready"]
    marker = tmp_path / "torn-down"
    Path(shown["path"], ".bb-env-teardown.sh").write_text(f"touch {marker}\n")
    await service.bb("thread", "archive", "fresh")
    removed = await service.wait_for(shown["id"], "removed")
    assert removed["hooks"]["teardown"]["status"] == "succeeded" and marker.exists()


async def test_personal_workspace_refuses_a_project(service, git_repo):
    refused = await spawn(service, "--environment-provider", "personal-workspace", "--project", str(git_repo))
    assert refused.returncode == 2 and "without a project" in refused.json()["error"]["message"]


async def test_project_checkout_switches_branch_in_place_and_never_removes_the_checkout(service, git_repo, git):
    git(git_repo, "branch", "feature")
    spawned = await spawn(
        service,
        "--environment-provider",
        "project-checkout",
        "--project",
        str(git_repo),
        "--environment-inputs",
        '{"branch": {"kind": "existing", "name": "feature"}}',
        "--thread-id",
        "t1",
        "--wait",
    )
    assert spawned.returncode == 0, spawned.stderr
    environment = await service.show(spawned.json()["environmentId"])
    assert environment["path"] == str(git_repo) and environment["ownsPath"] is False
    assert git(git_repo, "branch", "--show-current") == "feature"

    await service.bb("thread", "archive", "t1")
    kept = await service.wait_for(environment["id"], lambda e: e["threadIds"] == [])
    assert kept["status"] == "ready"  # never retires by itself
    assert (await service.bb("environment", "delete", environment["id"])).returncode == 0
    await service.wait_for(environment["id"], "removed")
    assert (git_repo / "README.md").exists() and git(git_repo, "branch", "--show-current") == "feature"


async def test_project_checkout_refuses_to_switch_a_dirty_checkout(service, git_repo, git):
    git(git_repo, "branch", "feature")
    (git_repo / "README.md").write_text("changed\n")
    refused = await spawn(
        service,
        "--environment-provider",
        "project-checkout",
        "--project",
        str(git_repo),
        "--environment-inputs",
        '{"branch": {"kind": "existing", "name": "feature"}}',
    )
    assert refused.returncode == 2
    assert "uncommitted changes" in refused.json()["error"]["message"]
    assert git(git_repo, "branch", "--show-current") == "main"


async def test_concurrent_spawns_on_one_checkout_share_one_environment_whatever_the_alias(service, git_repo, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(git_repo)
    attempts = await asyncio.gather(
        *(
            spawn(
                service, "--environment-provider", "project-checkout", "--project", str(project), "--thread-id", f"t{i}"
            )
            for i, project in enumerate([git_repo, git_repo, alias, git_repo])
        )
    )
    assert all(a.returncode == 0 for a in attempts), [a.stderr for a in attempts]
    environment_ids = {a.json()["environmentId"] for a in attempts}
    assert len(environment_ids) == 1
    shared = await service.wait_for(environment_ids.pop(), "ready")
    assert sorted(shared["threadIds"]) == ["t0", "t1", "t2", "t3"]
    assert len((await service.bb("environment", "list", "--json")).json()["environments"]) == 1


async def test_a_branch_switch_is_refused_while_a_thread_uses_the_checkout_and_replaces_it_once_idle(
    service, git_repo, git
):
    git(git_repo, "branch", "feature")

    async def on_checkout(thread_id: str, *inputs: str):
        return await spawn(
            service,
            "--environment-provider",
            "project-checkout",
            "--project",
            str(git_repo),
            "--thread-id",
            thread_id,
            *inputs,
        )

    switch_to_feature = ("--environment-inputs", '{"branch": {"kind": "existing", "name": "feature"}}')
    first = await on_checkout("t1", "--wait")
    assert first.returncode == 0, first.stderr
    held = first.json()["environmentId"]
    refused = await on_checkout("t2", *switch_to_feature)
    assert refused.returncode == 1 and held in refused.json()["error"]["message"]
    assert git(git_repo, "branch", "--show-current") == "main"

    await service.bb("thread", "archive", "t1")
    await service.wait_for(held, lambda e: e["threadIds"] == [])
    rejoined = await on_checkout("t3")
    assert rejoined.json()["environmentId"] == held  # the checkout's idle environment takes the thread
    await service.bb("thread", "archive", "t3")
    await service.wait_for(held, lambda e: e["threadIds"] == [])

    switched = await on_checkout("t4", *switch_to_feature, "--wait")
    assert switched.returncode == 0, switched.stderr
    assert switched.json()["environmentId"] != held
    await service.wait_for(held, "removed")  # the idle one gave the checkout up
    assert git(git_repo, "branch", "--show-current") == "feature"
    assert (git_repo / "README.md").exists()


async def test_a_project_path_escaping_the_checkout_is_refused(service, git_repo, tmp_path):
    (git_repo / "out").symlink_to(tmp_path)
    for path in ("../", "out"):
        refused = await spawn(
            service,
            "--environment-provider",
            "project-checkout",
            "--project",
            str(git_repo),
            "--environment-inputs",
            f'{{"path": "{path}"}}',
        )
        assert refused.returncode == 2 and "outside the project" in refused.json()["error"]["message"], refused.stdout


async def test_modal_without_credentials_is_blocked_with_a_clear_message(service, git_repo):
    refused = await spawn(service, "--environment-provider", "modal-sandbox", "--project", str(git_repo))
    assert refused.returncode == 1
    message = refused.json()["error"]["message"]
    assert "blocked" in message and "MODAL_TOKEN_ID" in message
    assert "Traceback" not in refused.stderr
    assert (await service.bb("environment", "list", "--json")).json()["environments"] == []


async def test_a_thread_asking_for_the_branch_of_another_threads_worktree_joins_its_environment(service, git_repo):
    first = await spawn(
        service,
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "t1",
        "--environment-inputs",
        '{"branch": {"kind": "new", "name": "feat"}}',
        "--wait",
    )
    assert first.returncode == 0, first.stderr
    environment_id = first.json()["environmentId"]

    second = await spawn(
        service,
        "--environment-provider",
        "git-worktree",
        "--project",
        str(git_repo),
        "--thread-id",
        "t2",
        "--environment-inputs",
        '{"branch": {"kind": "existing", "name": "feat"}}',
        "--wait",
    )

    assert second.returncode == 0, second.stderr
    assert second.json()["environmentId"] == environment_id
    await service.bb("thread", "archive", "t1")
    kept = await service.wait_for(environment_id, lambda e: e["threadIds"] == ["t2"])
    assert kept["status"] == "ready" and Path(kept["path"]).is_dir()


async def test_branch_names_may_be_full_refs_and_a_base_any_commit_ish(service, git_repo, git):
    first_commit = git(git_repo, "rev-parse", "HEAD")
    git(git_repo, "commit", "--quiet", "--allow-empty", "-m", "second")
    git(git_repo, "branch", "existing")
    for thread_id, branch in [
        ("t1", {"kind": "existing", "name": "refs/heads/existing"}),
        ("t2", {"kind": "new", "name": "refs/heads/from-tilde", "base": "main~1"}),
        ("t3", {"kind": "new", "name": "from-caret", "base": "HEAD^"}),
        ("t4", {"kind": "new", "name": "from-sha", "base": first_commit[:10]}),
    ]:
        spawned = await spawn(
            service,
            "--environment-provider",
            "git-worktree",
            "--project",
            str(git_repo),
            "--thread-id",
            thread_id,
            "--environment-inputs",
            json.dumps({"branch": branch}),
            "--wait",
        )
        assert spawned.returncode == 0, (branch, spawned.stderr)
        shown = await service.show(spawned.json()["environmentId"])
        assert git(Path(shown["path"]), "branch", "--show-current") == branch["name"].removeprefix("refs/heads/")
        assert shown["inputs"]["branch"]["name"] == branch["name"].removeprefix("refs/heads/")
    assert {git(git_repo, "rev-parse", name) for name in ("from-tilde", "from-caret", "from-sha")} == {first_commit}
    assert "refs/heads" not in git(git_repo, "branch", "--list")
