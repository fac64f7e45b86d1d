"""One real sandbox through create, pause, resume and remove. Runs only with Modal credentials.

Costs a few sandbox-minutes in the account of MODAL_TOKEN_ID (app `bb-environments-live-test`);
the first run also builds the standard image.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import modal
import pytest

from bb_environments.providers.contract import CreateContext, Created, RemoveContext, Removed
from bb_environments.providers.modal_sandbox import PATH_KEY_TAG, ModalInputs, ModalSandboxProvider

pytestmark = pytest.mark.skipif(
    not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")),
    reason="needs MODAL_TOKEN_ID and MODAL_TOKEN_SECRET",
)
PUBLIC_ORIGIN = "https://github.com/octocat/Hello-World.git"
APP_NAME = "bb-environments-live-test"


class PrintingReporter:
    def step(self, text: str) -> None:
        print(f"» {text}")

    def log(self, text: str) -> None:
        print(f"  {text}")


def test_create_pause_resume_remove_one_real_sandbox(
    git_repo: Path, git: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BB_MODAL_APP_NAME", APP_NAME)
    git(git_repo, "remote", "add", "origin", PUBLIC_ORIGIN)
    (tmp_path / "data").mkdir()
    path_key = f"live-{uuid.uuid4().hex[:12]}"
    provider = ModalSandboxProvider()
    remove_context = RemoveContext(
        host_id="local",
        data_dir=str(tmp_path / "data"),
        project_path=str(git_repo),
        inputs=ModalInputs(),
        path=None,
        path_key=path_key,
        attempt=1,
        resource=None,
        report=PrintingReporter(),
    )
    try:
        result = provider.create(
            CreateContext(
                host_id="local",
                project_path=str(git_repo),
                inputs=ModalInputs(cpu=1.0, memory_mib=1024, timeout_hours=1),
                data_dir=str(tmp_path / "data"),
                thread_id="live",
                path_key=path_key,
                report=PrintingReporter(),
            )
        )
        assert isinstance(result, Created), result
        resource = result.resource
        assert resource is not None

        paused = provider.pause(resource)
        assert paused["snapshotId"] and paused["sandboxId"] is None

        resumed = provider.resume(paused)
        client = modal.Client.from_credentials(os.environ["MODAL_TOKEN_ID"], os.environ["MODAL_TOKEN_SECRET"])
        sandbox = modal.Sandbox.from_id(resumed["sandboxId"], client=client)
        assert sandbox.get_tags()[PATH_KEY_TAG] == path_key
        process = sandbox.exec("test", "-f", f"{resumed['workdir']}/README", timeout=60)
        assert process.wait() == 0, "the clone did not survive pause and resume"
        client.close()

        remove_context = dataclasses.replace(remove_context, resource=resumed)
    finally:
        assert provider.remove(remove_context) == Removed()
