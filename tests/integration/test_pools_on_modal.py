"""A warm pool of `modal-sandbox` (SPEC 10) with real processes: `bb serve` and its nats-server,
the project's origin behind a real `git daemon`, and Modal replaced at its SDK boundary by the fake
(tests/support/fake_modal_provider.py), whose sandboxes clone and set up for real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fakes.fake_modal import VALID_TOKEN
from tests.integration.conftest import Service, environment_events, lifecycle_types, service_environment
from tests.integration.test_pools import commit_setup, head, pool_becomes, setups, spawn
from tests.support.git_daemon import served_origin

pytestmark = pytest.mark.asyncio

FAKE_MODAL = "tests.support.fake_modal_provider:FakeModalSandbox"


async def test_a_thread_is_bound_to_a_sandbox_cloned_and_set_up_ahead_without_a_create_or_setup(
    tmp_path: Path, git_repo: Path
) -> None:
    marker = tmp_path / "setups"
    commit_setup(git_repo, marker)
    served, sandboxes = tmp_path / "served", tmp_path / "sandboxes"
    served.mkdir()
    with served_origin(git_repo, served):
        environment = service_environment(
            tmp_path / "data",
            BB_EXTRA_PROVIDERS=FAKE_MODAL,
            FAKE_MODAL_ROOT=str(sandboxes),
            MODAL_TOKEN_ID=VALID_TOKEN[0],
            MODAL_TOKEN_SECRET=VALID_TOKEN[1],
        )
        service = Service(tmp_path / "data", environment)
        await service.start()
        try:
            done = await service.bb(
                "pool", "set", "--project", str(git_repo), "--provider", "modal-sandbox", "--size", "1", "--json"
            )
            assert done.returncode == 0, done.stderr
            pool = await pool_becomes(service, "ready", lambda p: p["members"]["ready"] == 1)
            assert pool["baseCommit"] == head(git_repo)

            environment_id = await spawn(service, git_repo, "t-pooled", provider="modal-sandbox")

            events = await environment_events(service, environment_id)
            kinds = lifecycle_types(events)
            assert kinds[: kinds.index("bound")][-1] == "pooled"
            after = kinds[kinds.index("bound") + 1 :]
            assert after[-1] == "ready" and not any(k in after for k in ("created", "setup_started", "setup_succeeded"))
            assert "resource_recorded" in after  # the resource now names the thread the sandbox is tagged for
            shown = await service.show(environment_id)
            assert (shown["poolId"], shown["pooled"], shown["threadIds"]) == (pool["id"], False, ["t-pooled"])
            # The sandbox the member's create cloned and set up, its files as the setup left them.
            [sandbox_id] = [m[1] for line in shown["transcript"] if (m := re.match(r"Sandbox (\S+) \(tag", line))]
            clone = sandboxes / sandbox_id / "workspace" / git_repo.name
            assert (clone / "made.txt").read_text().strip() == f"made at {head(git_repo)}"
            assert setups(marker)[str(clone)] == 1
            # The pool prepares the member's replacement (it may have begun already): another
            # sandbox, set up once.
            await pool_becomes(service, "refilled", lambda p: p["members"]["ready"] == 1)
            assert sorted(setups(marker).values()) == [1, 1]
        finally:
            await service.stop()
