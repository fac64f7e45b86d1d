"""The adapter between bb and the Modal SDK: every call into the `modal` package is made here.

This is the only module that imports `modal`, and it does so on first use, so loading the
provider costs nothing until a Modal call is made. `ModalSdk(sdk)` takes the `modal` module or a
stand-in with the same API (tests/fakes/fake_modal.py). `ModalSdk.connect()` opens a
`ModalSession` on an authenticated client. Each session method is one step against Modal, and a
Modal error (or an OSError on the way) leaves it as `ModalOperationFailed`: one sentence naming
the action and never carrying the token. It is terminal for refused credentials, invalid
requests, missing objects and image build errors, and transient otherwise. The objects the
methods return (apps, images, sandboxes) are handles to pass back to the session. Callers read
only their `object_id`.

The Modal token (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET) is read from the environment for each
connection and goes only into `modal.Client.from_credentials`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

from bb_environments.providers.contract import Reporter
from bb_environments.providers.modal_settings import NO_CREDENTIALS, Dockerfile, credentials_from_env

POLL_INTERVAL_S = 1.0

T = TypeVar("T")


class ModalOperationFailed(Exception):
    """A Modal call failed; the message is one sentence and carries no credential."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class SandboxSize(Protocol):
    """What a sandbox is started with (the provider's inputs)."""

    @property
    def cpu(self) -> float: ...

    @property
    def memory_mib(self) -> int: ...

    @property
    def timeout_hours(self) -> int: ...


class ModalSdk:
    def __init__(self, sdk: ModuleType | None = None, poll_interval_s: float = POLL_INTERVAL_S) -> None:
        """`sdk` is the `modal` module (imported on first use) or a stand-in with the same API."""
        self._sdk = sdk
        self._poll_interval_s = poll_interval_s

    def _modal(self) -> Any:
        if self._sdk is None:
            import modal
            import modal.experimental  # noqa: F401  (image_delete lives there in modal 1.x)

            self._sdk = modal
        return self._sdk

    @contextmanager
    def connect(self) -> Iterator[ModalSession]:
        """A session on a client made from the environment's token, closed on leaving."""
        credentials = credentials_from_env()
        if credentials is None:
            raise ModalOperationFailed(NO_CREDENTIALS)
        sdk = self._modal()
        client = _call(
            sdk,
            "connect",
            lambda: sdk.Client.from_credentials(credentials.token_id, credentials.token_secret),
            transient=True,
        )
        try:
            yield ModalSession(sdk, client, self._poll_interval_s)
        finally:
            client.close()


class ModalSession:
    """One authenticated client. Every method raises ModalOperationFailed for Modal's errors."""

    def __init__(self, sdk: Any, client: Any, poll_interval_s: float) -> None:
        self._sdk = sdk
        self._client = client
        self._poll_interval_s = poll_interval_s

    def _call(self, action: str, call: Callable[[], T], transient: bool | None = None) -> T:
        return _call(self._sdk, action, call, transient)

    def check_credentials(self) -> None:
        """An authenticated call that allocates nothing."""
        self._call("check the credentials", self._client.hello)

    def app(self, name: str, create_if_missing: bool) -> Any | None:
        """The app, or None when it does not exist and may not be created."""
        sdk, client = self._sdk, self._client
        try:
            return sdk.App.lookup(name, client=client, create_if_missing=create_if_missing)
        except sdk.Error as error:
            if isinstance(error, sdk.exception.NotFoundError) and not create_if_missing:
                return None
            raise _translated(error, f"look up the Modal app {name}") from None

    def ensure_image(self, app: Any, dockerfile: Dockerfile, data_dir: Path, report: Reporter) -> Any:
        """The image published under the Dockerfile's name, built and published when missing."""
        sdk, client = self._sdk, self._client
        name = dockerfile.image_name
        try:
            image = sdk.Image.from_name(name, client=client).build(app)
            report.log(f"Reusing the {name} Modal image")
            return image
        except sdk.exception.NotFoundError:
            pass
        except sdk.Error as error:
            raise _translated(error, f"look up the {name} image") from None
        report.step(f"Building the {name} Modal image (first launch)")
        # Build from a copy named by its hash, so the text built is exactly the text hashed.
        frozen = data_dir / "images" / f"{dockerfile.sha256}.Dockerfile"
        frozen.parent.mkdir(parents=True, exist_ok=True)
        frozen.write_text(dockerfile.text)
        image = self._call(
            f"build the {name} image",
            lambda: sdk.Image.from_dockerfile(frozen, context_dir=dockerfile.path.parent).build(app),
        )
        self._call(f"publish the {name} image", lambda: image.publish(name, client=client))
        return image

    def snapshot_image(self, snapshot_id: str) -> Any:
        return self._call("find the snapshot", lambda: self._sdk.Image.from_id(snapshot_id, client=self._client))

    def start_sandbox(self, app: Any, image: Any, tags: dict[str, str], size: SandboxSize) -> Any:
        """A sandbox created with its tags in the same call, so it can always be found by them."""
        return self._call(
            "create the sandbox",
            lambda: self._sdk.Sandbox.create(
                app=app,
                image=image,
                tags=tags,
                timeout=size.timeout_hours * 3600,
                cpu=size.cpu,
                memory=size.memory_mib,
                client=self._client,
            ),
        )

    def sandbox(self, sandbox_id: str) -> Any:
        return self._call("find the sandbox", lambda: self._sdk.Sandbox.from_id(sandbox_id, client=self._client))

    def running_sandboxes(self, app: Any, tags: dict[str, str]) -> list[Any]:
        """The app's running sandboxes that carry at least these tags."""
        return self._call(
            "list sandboxes", lambda: list(self._sdk.Sandbox.list(app_id=app.app_id, tags=tags, client=self._client))
        )

    def tags(self, sandbox: Any) -> dict[str, str]:
        tags: dict[str, str] = sandbox.get_tags()
        return tags

    def set_tags(self, sandbox: Any, tags: dict[str, str]) -> None:
        """Replace the sandbox's tags (Modal keeps only the set given) in one call."""
        self._call("tag the sandbox", lambda: sandbox.set_tags(tags))

    def sandbox_and_tags(self, sandbox_id: str, action: str) -> tuple[Any, dict[str, str]] | None:
        """The sandbox and its tags, or None when no such sandbox exists."""
        sdk = self._sdk
        try:
            sandbox = sdk.Sandbox.from_id(sandbox_id, client=self._client)
            tags = sandbox.get_tags()
        except sdk.exception.NotFoundError:
            return None
        except sdk.Error as error:
            raise _translated(error, action) from None
        return sandbox, tags

    def has_stopped(self, sandbox: Any) -> bool:
        return self._call("check the sandbox", sandbox.poll) is not None

    def snapshot(self, sandbox: Any, timeout_s: int) -> Any:
        """The sandbox's filesystem as an image that never expires; the sandbox keeps running."""
        return self._call(
            "snapshot the sandbox (it keeps running)",
            lambda: sandbox.snapshot_filesystem(timeout_s, ttl=None),
            transient=True,
        )

    def terminate(self, sandbox: Any, action: str) -> None:
        self._call(action, sandbox.terminate)

    def terminate_by_id(self, sandbox_id: str) -> None:
        """Terminate the sandbox; one that is already gone counts as terminated."""
        sdk = self._sdk
        try:
            sdk.Sandbox.from_id(sandbox_id, client=self._client).terminate()
        except sdk.exception.NotFoundError:
            pass  # already gone
        except sdk.Error as error:
            raise _translated(error, f"terminate sandbox {sandbox_id}") from None

    def terminate_quietly(self, sandbox: Any, report: Reporter) -> None:
        """Terminate the sandbox; a failure is only reported, for removal to retry."""
        try:
            sandbox.terminate()
        except self._sdk.Error as error:
            report.log(f"Could not terminate sandbox {sandbox.object_id} ({type(error).__name__}); removal will retry")

    def delete_images(self, image_ids: list[str]) -> None:
        """Delete the images (snapshots); one that is already gone counts as deleted."""
        sdk = self._sdk
        for image_id in image_ids:
            try:
                sdk.experimental.image_delete(image_id, client=self._client)
            except sdk.exception.NotFoundError:
                pass
            except sdk.Error as error:
                raise _translated(error, f"delete snapshot {image_id}") from None

    def run_script(
        self,
        sandbox: Any,
        script: str,
        argument: str,
        timeout_s: int,
        label: str,
        stdin: str,
        raise_if_cancelled: Callable[[], None],
    ) -> tuple[int, str]:
        """Run `bash -c script` with one argument and `stdin`; its exit code and output.

        `raise_if_cancelled` is called while the process runs, to stop waiting for it.
        """
        process = self._call(label, lambda: sandbox.exec("bash", "-c", script, "bb", argument, timeout=timeout_s))
        self._call(label, lambda: _send_stdin(process, stdin))
        while self._call(label, process.poll) is None:
            raise_if_cancelled()
            time.sleep(self._poll_interval_s)
        output = self._call(label, process.stdout.read)
        return process.returncode, output


def redact(text: str, secrets: tuple[str, ...] | list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _call(sdk: Any, action: str, call: Callable[[], T], transient: bool | None = None) -> T:
    """Run one SDK call; Modal errors become ModalOperationFailed naming `action`."""
    try:
        return call()
    except sdk.Error as error:
        raise _translated(error, action, transient) from None
    except OSError as error:
        raise ModalOperationFailed(f"could not {action}: {error.strerror or error}", transient=True) from None


def _translated(error: Exception, action: str, transient: bool | None = None) -> ModalOperationFailed:
    """One sentence naming the action; the token never appears, whatever Modal's message held."""
    credentials = credentials_from_env()
    name = type(error).__name__
    detail = redact(
        str(error).strip().splitlines()[0] if str(error).strip() else name, credentials.secrets if credentials else ()
    )
    if name in ("AuthError", "PermissionDeniedError"):
        hint = f" (token {credentials.hint})" if credentials else ""
        return ModalOperationFailed(f"Modal refused the credentials{hint} while trying to {action}: {detail}")
    terminal = name in ("InvalidError", "NotFoundError", "ImageBuildError", "AlreadyExistsError")
    return ModalOperationFailed(
        f"could not {action}: {detail}", transient=(not terminal) if transient is None else transient
    )


def _send_stdin(process: Any, text: str) -> None:
    process.stdin.write(text)
    process.stdin.write_eof()
    process.stdin.drain()
