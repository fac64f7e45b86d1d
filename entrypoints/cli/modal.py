"""The commands of `bb machine` and `bb modal`: Modal sandboxes and settings, handled by
`providers.modal_machine` and `providers.modal_settings` directly. The two groups are declared in
the package's __init__, which loads this module only to run or list these commands.

These commands do not go through the service: they use MODAL_TOKEN_ID / MODAL_TOKEN_SECRET from
this process's environment and the provider's data dir under `--data-dir`. Machines are bare
sandboxes from the standard image, tagged `bb-machine=1`; they are not environments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from bb_environments.entrypoints.cli.support import Failure, emit, json_option, run_command, stderr, stdout
from bb_environments.entrypoints.config import Settings
from bb_environments.providers.contract import InvalidInputs
from bb_environments.providers.modal_machine import ModalMachines
from bb_environments.providers.modal_sandbox import ModalInputs
from bb_environments.providers.modal_sdk import ModalOperationFailed
from bb_environments.providers.modal_settings import (
    PROVIDER_ID,
    Dockerfile,
    DockerfileError,
    SettingsError,
    effective_dockerfile,
    load_settings,
    provider_data_dir,
    reset_dockerfile,
    store_dockerfile,
)

T = TypeVar("T")


class _StderrReporter:
    def step(self, text: str) -> None:
        stderr.print(f"» {text}", markup=False)

    def log(self, text: str) -> None:
        stderr.print(f"  {text}", markup=False)


async def _provider_call(call: Callable[[], T]) -> T:
    """Run a blocking provider call off the event loop (the Modal SDK refuses to block inside one)."""
    try:
        return await asyncio.to_thread(call)
    except ModalOperationFailed as failure:
        raise Failure("failed", str(failure)) from None
    except (SettingsError, DockerfileError, InvalidInputs) as bad:
        raise Failure("invalid_input", str(bad)) from None


def _data_dir(settings: Settings) -> Path:
    return provider_data_dir(settings.data_dir)


# -- bb machine ------------------------------------------------------------------------------------


@click.command("create")
@click.option(
    "--provider",
    "provider_id",
    type=click.Choice([PROVIDER_ID]),
    required=True,
    help="The machine's provider (only modal-sandbox makes machines).",
)
@json_option
@click.pass_obj
@run_command
async def machine_create(settings: Settings, provider_id: str, as_json: bool) -> None:
    """Start a sandbox from the standard image (built on first use)."""
    data_dir = str(_data_dir(settings))
    created = await _provider_call(lambda: ModalMachines().create_machine(data_dir, ModalInputs(), _StderrReporter()))
    emit({"machine": created}, as_json, lambda d: stdout.print(d["machine"]["id"], markup=False))


def list_modal_machines(settings: Settings) -> list[dict[str, Any]]:
    """The running Modal machines (for `bb machine list`)."""
    data_dir = str(_data_dir(settings))
    return asyncio.run(_provider_call(lambda: ModalMachines().list_machines(data_dir)))


def remove_modal_machine(machine_id: str) -> dict[str, Any]:
    """Terminate a Modal machine (for `bb machine remove sb-...`)."""
    if not asyncio.run(_provider_call(lambda: ModalMachines().remove_machine(machine_id))):
        raise Failure("not_found", f"no Modal sandbox {machine_id}")
    return {"machineId": machine_id, "status": "removed"}


# -- bb modal --------------------------------------------------------------------------------------


@click.group()
def account() -> None:
    """The Modal credentials (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET)."""


@account.command("inspect")
@json_option
@click.pass_obj
@run_command
async def account_inspect(settings: Settings, as_json: bool) -> None:
    """Check the credentials against Modal; allocates nothing."""
    data_dir = str(_data_dir(settings))
    status = await _provider_call(lambda: ModalMachines().inspect_account(data_dir))
    document = msgspec.to_builtins(status)
    if status.status != "ok":
        raise Failure("refused", status.reason or "Modal credentials are not usable", document)

    def human(d: dict[str, Any]) -> None:
        presence = "exists" if d["appExists"] else "not created yet"
        stdout.print(f"ok: token {d['tokenId']}, app {d['appName']} ({presence})", markup=False)

    emit(document, as_json, human)


@click.group()
def image() -> None:
    """The Dockerfile sandboxes are built from."""


@image.command("show")
@json_option
@click.pass_obj
@run_command
async def image_show(settings: Settings, as_json: bool) -> None:
    """Show the Dockerfile in use, where it comes from and the image name it builds."""
    data_dir = _data_dir(settings)
    chosen = await _provider_call(lambda: effective_dockerfile(data_dir, load_settings(data_dir)))
    emit(_image_document(chosen), as_json, _print_image)


@image.command("set")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="The Dockerfile of the image to use.",
)
@json_option
@click.pass_obj
@run_command
async def image_set(settings: Settings, path: Path, as_json: bool) -> None:
    """Use this Dockerfile from now on (validated first; a refused file changes nothing)."""
    data_dir = _data_dir(settings)
    await _provider_call(lambda: store_dockerfile(data_dir, path))
    chosen = await _provider_call(lambda: effective_dockerfile(data_dir, load_settings(data_dir)))
    emit(_image_document(chosen), as_json, _print_image)


@image.command("reset")
@json_option
@click.pass_obj
@run_command
async def image_reset(settings: Settings, as_json: bool) -> None:
    """Go back to the Dockerfile shipped with the provider."""
    data_dir = _data_dir(settings)
    removed = await _provider_call(lambda: reset_dockerfile(data_dir))
    chosen = await _provider_call(lambda: effective_dockerfile(data_dir, load_settings(data_dir)))
    emit(_image_document(chosen) | {"removedStored": removed}, as_json, _print_image)


def _image_document(chosen: Dockerfile) -> dict[str, Any]:
    return {
        "source": chosen.source,
        "path": str(chosen.path),
        "sha256": chosen.sha256,
        "imageName": chosen.image_name,
        "dockerfile": chosen.text,
    }


def _print_image(d: dict[str, Any]) -> None:
    stdout.print(f"{d['imageName']}  ({d['source']}: {d['path']})", markup=False)
    stdout.print(d["dockerfile"], markup=False)
