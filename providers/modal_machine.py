"""The backend of `bb machine` and `bb modal account` (entrypoints/cli/modal.py).

Machines are bare Modal sandboxes from the modal-sandbox provider's standard image, tagged
`bb-machine=1`. They are not environments: the service never sees them, and these calls use
MODAL_TOKEN_ID / MODAL_TOKEN_SECRET from the calling process's environment. Modal is reached
through `providers.modal_sdk`, whose `ModalOperationFailed` these calls raise.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import msgspec

from bb_environments.providers.contract import Reporter
from bb_environments.providers.modal_sandbox import ModalInputs, check_bounds
from bb_environments.providers.modal_sdk import ModalOperationFailed, ModalSdk
from bb_environments.providers.modal_settings import (
    NO_CREDENTIALS,
    SettingsError,
    credentials_from_env,
    effective_dockerfile,
    load_settings,
)

MACHINE_TAG = "bb-machine"


class AccountStatus(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    status: Literal["ok", "blocked"]
    reason: str | None = None
    token_id: str | None = None
    """The first characters of the token id only."""
    app_name: str | None = None
    app_exists: bool | None = None


class ModalMachines:
    def __init__(self, sdk: ModuleType | None = None) -> None:
        """`sdk` is the `modal` module (imported on first use) or a stand-in with the same API."""
        self._modal = ModalSdk(sdk)

    def inspect_account(self, data_dir: str) -> AccountStatus:
        """Check the credentials with an authenticated call; allocates nothing."""
        credentials = credentials_from_env()
        if credentials is None:
            return AccountStatus("blocked", NO_CREDENTIALS)
        try:
            app_name = load_settings(data_dir).app_name
            with self._modal.connect() as session:
                session.check_credentials()
                app_exists = session.app(app_name, create_if_missing=False) is not None
        except (ModalOperationFailed, SettingsError) as failure:
            return AccountStatus("blocked", str(failure), credentials.hint)
        return AccountStatus("ok", None, credentials.hint, app_name, app_exists)

    def create_machine(self, data_dir: str, inputs: ModalInputs, report: Reporter) -> dict[str, Any]:
        """A bare sandbox from the standard image, tagged `bb-machine=1`."""
        check_bounds(inputs)
        settings = load_settings(data_dir)
        dockerfile = effective_dockerfile(data_dir, settings)
        with self._modal.connect() as session:
            app = session.app(settings.app_name, create_if_missing=True)
            image = session.ensure_image(app, dockerfile, Path(data_dir), report)
            tags = {MACHINE_TAG: "1"}
            sandbox = session.start_sandbox(app, image, tags, inputs)
        return {"id": sandbox.object_id, "appName": settings.app_name, "imageId": image.object_id, "tags": tags}

    def list_machines(self, data_dir: str) -> list[dict[str, Any]]:
        app_name = load_settings(data_dir).app_name
        with self._modal.connect() as session:
            app = session.app(app_name, create_if_missing=False)
            if app is None:
                return []
            sandboxes = session.running_sandboxes(app, {MACHINE_TAG: "1"})
            return [
                {"id": sandbox.object_id, "appName": app_name, "tags": session.tags(sandbox)} for sandbox in sandboxes
            ]

    def remove_machine(self, machine_id: str) -> bool:
        """Terminate a machine; False when no such sandbox exists. Refuses sandboxes it did not make."""
        with self._modal.connect() as session:
            found = session.sandbox_and_tags(machine_id, "find the machine")
            if found is None:
                return False
            sandbox, tags = found
            if tags.get(MACHINE_TAG) != "1":
                raise ModalOperationFailed(f"sandbox {machine_id} is not a bb machine; it is left alone")
            session.terminate(sandbox, "terminate the machine")
        return True
