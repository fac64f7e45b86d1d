"""`modal-sandbox` on the fake Modal cloud (tests/fakes/fake_modal.py), loaded into `bb serve`
with BB_EXTRA_PROVIDERS (it replaces the installed one, having its id): the Modal side lives in
the service's process, each sandbox's files in a directory of its own under $FAKE_MODAL_ROOT,
where the clone and the setup run for real."""

from __future__ import annotations

import os
from pathlib import Path

from bb_environments.providers.modal_sandbox import ModalSandboxProvider
from tests.fakes.fake_modal import FakeModalCloud, local_filesystems


class FakeModalSandbox(ModalSandboxProvider):
    def __init__(self) -> None:
        cloud = FakeModalCloud(exec_handler=local_filesystems(Path(os.environ["FAKE_MODAL_ROOT"])))
        super().__init__(sdk=cloud.module, poll_interval_s=0.05)
