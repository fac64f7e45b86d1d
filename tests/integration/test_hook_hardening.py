"""What a repository's code may run, through a real `bb serve` (SPEC 9): only the hooks the core
runs, never a script that resolves outside its workspace."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bb_environments.hooks.records import HookRecords
from tests.integration.conftest import Service, service_environment, write_hooks


async def spawn(service: Service, repo: Path, thread_id: str) -> dict:
    spawned = await service.bb(
        "thread",
        "spawn",
        "--environment-provider",
        "git-worktree",
        "--project",
        str(repo),
        "--thread-id",
        thread_id,
        "--wait",
        "--json",
    )
    assert spawned.returncode in (0, 1), spawned.stderr
    return await service.show(spawned.json()["environmentId"])


async def test_a_git_hook_a_setup_plants_in_the_shared_git_dir_does_not_run_at_the_next_create(
    service, git_repo, tmp_path
):
    marker, ran = tmp_path / "hooks-ran", tmp_path / "post-checkout-ran"
    hook = '"$(git rev-parse --git-common-dir)/hooks/post-checkout"'
    write_hooks(git_repo, marker, setup=f"printf '#!/bin/sh\\ntouch {ran}\\n' > {hook} && chmod +x {hook}")

    first = await spawn(service, git_repo, "t1")
    assert first["status"] == "ready", first
    assert os.access(git_repo / ".git" / "hooks" / "post-checkout", os.X_OK)

    second = await spawn(service, git_repo, "t2")
    assert second["status"] == "ready", second
    assert not ran.exists()

    await service.bb("thread", "archive", "t1")
    await service.wait_for(first["id"], "removed")
    assert not ran.exists()


def plant_git_hook(repo: Path, name: str, body: str) -> None:
    hook = repo / ".git" / "hooks" / name
    hook.write_text(f"#!/bin/sh\n{body}\n")
    hook.chmod(0o755)


@pytest.mark.parametrize("service", [{"BB_GIT_HOOKS": "run"}], indirect=True)
async def test_with_git_hooks_run_the_post_checkout_of_a_new_worktree_runs_in_the_setup_and_its_output_is_in_the_transcript(
    service, git_repo, tmp_path
):
    write_hooks(git_repo, tmp_path / "hooks-ran")
    plant_git_hook(git_repo, "post-checkout", 'echo "post-checkout $* in $PWD"; echo "setup saw $0" > .hook-ran')

    environment = await spawn(service, git_repo, "t1")

    assert environment["status"] == "ready", environment
    head = subprocess.run(
        ["git", "-C", environment["path"], "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    said = f"post-checkout {'0' * 40} {head} 1 in {environment['path']}"
    shown = await service.wait_for(environment["id"], lambda e: "preparing the workspace" in "\n".join(e["transcript"]))
    transcript = "\n".join(shown["transcript"])
    # In the setup's run, before its script: where a hook's output goes, and as part of its step.
    assert (
        transcript.index("Running .bb-env-setup.sh")
        < transcript.index(said)
        < transcript.index("preparing the workspace")
    ), transcript
    kept = HookRecords(service.data_dir / "hooks").log_path(environment["hooks"]["setup"]["operationId"]).read_text()
    assert kept.startswith(said + "\n"), kept
    assert (Path(environment["path"]) / ".hook-ran").exists()


@pytest.mark.parametrize("service", [{"BB_GIT_HOOKS": "run", "BB_HOOK_TIMEOUT_S": "2"}], indirect=True)
async def test_with_git_hooks_run_a_hanging_post_checkout_is_cut_off_by_the_hook_timeout(service, git_repo, tmp_path):
    plant_git_hook(git_repo, "post-checkout", f"echo $$ > {tmp_path / 'hook.pid'}; echo hanging; exec sleep 600")

    environment = await spawn(service, git_repo, "t1")

    assert environment["status"] == "error", environment
    assert environment["hooks"]["setup"]["status"] == "failed", environment
    assert "post-checkout (the repository's git hook) timed out after 2s" in environment["statusMessage"]
    assert "hanging" in environment["transcript"]
    assert not Path("/proc", (tmp_path / "hook.pid").read_text().strip()).exists()


async def test_git_hooks_set_to_anything_but_off_or_run_are_refused_at_start_naming_what_is_allowed(tmp_path):
    environment = service_environment(tmp_path / "data", BB_GIT_HOOKS="always")
    started = subprocess.run(
        [*Service.cli(), "serve"], env=environment, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert started.returncode == 2, started.stderr
    assert "BB_GIT_HOOKS 'always' is not allowed: use off or run" in started.stderr
    assert not (tmp_path / "data" / "server.json").exists()


async def test_the_start_says_in_one_line_that_hooks_can_read_the_credentials_without_a_workspace_user(service):
    said = [line for line in service.log_tail().splitlines() if "can read the credentials" in line]
    assert len(said) == 1 and "BB_WORKSPACE_USER is unset: hooks run as" in said[0], said


def commit_symlinked_hook(repo: Path, name: str, target: Path) -> None:
    (repo / name).symlink_to(target)
    subprocess.run(["git", "-C", str(repo), "add", name], check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo), "commit", "-qm", name], check=True
    )


async def test_a_setup_script_symlinked_outside_the_workspace_is_not_run_and_the_setup_fails_naming_it(
    service, git_repo, tmp_path
):
    ran = tmp_path / "outside-ran"
    outside = tmp_path / "outside.sh"
    outside.write_text(f"touch {ran}\n")
    commit_symlinked_hook(git_repo, ".bb-env-setup.sh", outside)

    environment = await spawn(service, git_repo, "t1")

    assert environment["status"] == "error", environment
    assert environment["hooks"]["setup"]["status"] == "failed"
    assert ".bb-env-setup.sh is a symlink to" in environment["statusMessage"]
    assert "outside the workspace" in environment["statusMessage"]
    assert not ran.exists()


async def test_a_teardown_script_symlinked_outside_the_workspace_is_not_run_and_the_removal_goes_on(
    service, git_repo, tmp_path
):
    ran = tmp_path / "outside-ran"
    outside = tmp_path / "outside.sh"
    outside.write_text(f"touch {ran}\n")
    commit_symlinked_hook(git_repo, ".bb-env-teardown.sh", outside)
    inside = git_repo / "scripts" / "setup.sh"
    inside.parent.mkdir()
    inside.write_text(f"touch {tmp_path / 'inside-ran'}\n")
    subprocess.run(["git", "-C", str(git_repo), "add", "scripts"], check=True)
    commit_symlinked_hook(git_repo, ".bb-env-setup.sh", Path("scripts", "setup.sh"))  # inside: runs

    environment = await spawn(service, git_repo, "t1")
    assert environment["status"] == "ready", environment
    assert (tmp_path / "inside-ran").exists()

    await service.bb("thread", "archive", "t1")
    removed = await service.wait_for(environment["id"], "removed")
    assert removed["hooks"]["teardown"]["status"] == "failed"
    assert not ran.exists() and not Path(environment["path"]).exists()
    await service.wait_for(
        environment["id"], lambda e: any(".bb-env-teardown.sh is a symlink to" in line for line in e["transcript"])
    )


async def test_a_hook_printing_30_mb_keeps_8_mib_on_disk_and_its_transcript_says_how_much_was_dropped(
    service, git_repo, tmp_path
):
    write_hooks(
        git_repo,
        tmp_path / "hooks-ran",
        setup=(
            "head -c 100000 /dev/zero | tr '\\0' L; echo\n"  # one line of 100 kB
            "yes 0123456789012345678901234567890123456789012345678 | head -c 30000000\n"
        ),
    )

    environment = await spawn(service, git_repo, "t1")

    assert environment["status"] == "ready", environment
    operation = environment["hooks"]["setup"]["operationId"]
    kept = HookRecords(service.data_dir / "hooks").log_path(operation).read_bytes()
    assert len(kept) <= 8 * 1024 * 1024
    assert kept.startswith(
        b"preparing the workspace\n" + b"L" * 16384 + b" [bb: line cut, 83616 more bytes of it not kept]\n"
    )
    marker = kept.rsplit(b"\n", 2)[1].decode()
    assert marker.startswith("[bb: ") and marker.endswith(
        " bytes of output not kept: beyond BB_HOOK_OUTPUT_MAX_BYTES (8388608 bytes)]"
    ), marker
    printed = 100_001 + 30_000_000
    assert printed - 83616 - 8 * 1024 * 1024 <= int(marker.split()[1]) <= printed - 83616 - len(kept) + 1000
    await service.wait_for(
        environment["id"],
        lambda e: any("bytes of output not kept: beyond BB_HOOK_OUTPUT_MAX_BYTES" in line for line in e["transcript"]),
        timeout=120,
    )
