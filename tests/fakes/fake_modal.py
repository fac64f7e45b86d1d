"""A stand-in for the `modal` module (1.x): exactly the calls `providers.modal_sdk` makes.

Names, parameters and defaults mirror modal 1.6.4's blocking API (`tests/unit/
test_modal_sandbox_provider.py` checks them against the installed package with
`inspect.signature`); behaviour is the part the provider relies on: a sandbox exists from the
moment `Sandbox.create` runs, `Sandbox.list` returns running sandboxes having at least the given
tags, `Sandbox.set_tags` replaces the whole set, `Image.from_name(...).build(app)` raises NotFoundError for an unpublished name.

    cloud = FakeModalCloud()
    provider = ModalSandboxProvider(sdk=cloud.module)
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

VALID_TOKEN = ("ak-fake-token-id", "as-fake-token-secret")


class Error(Exception):
    pass


class NotFoundError(Error):
    pass


class AuthError(Error):
    pass


class ConnectionError(Error):  # noqa: A001 (the name modal uses)
    pass


class SnapshotCreationError(Error):
    pass


@dataclass
class ExecResult:
    returncode: int = 0
    output: str = ""


@dataclass
class ExecCall:
    sandbox_id: str
    args: tuple[str, ...]
    timeout: int | None
    stdin: str = ""


@dataclass
class SandboxRecord:
    id: str
    app_id: str
    image_id: str
    tags: dict[str, str]
    timeout: int | None
    cpu: float | None
    memory: int | None
    running: bool = True


@dataclass
class FakeModalCloud:
    """The server side: what exists in the fake account, and switches tests flip."""

    token: tuple[str, str] = VALID_TOKEN
    apps: dict[str, str] = field(default_factory=dict)
    published: dict[str, str] = field(default_factory=dict)
    """image name -> image id"""
    builds: list[str] = field(default_factory=list)
    deleted_images: list[str] = field(default_factory=list)
    sandboxes: dict[str, SandboxRecord] = field(default_factory=dict)
    execs: list[ExecCall] = field(default_factory=list)
    exec_handler: Callable[[ExecCall], ExecResult] = lambda call: ExecResult()
    on_sandbox_created: Callable[[SandboxRecord], None] = lambda record: None
    """Runs after the sandbox exists, before `Sandbox.create` returns (may raise, as a crash would)."""
    snapshot_error: Exception | None = None
    snapshots: list[str] = field(default_factory=list)
    tag_calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    """(sandbox id, tags) for every `Sandbox.set_tags`."""
    closed_clients: int = 0
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.module = _module(self)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def running(self) -> list[SandboxRecord]:
        return [record for record in self.sandboxes.values() if record.running]

    def check(self, client: Any) -> None:
        if not isinstance(client, _ClientBase) or client.credentials != self.token:
            raise AuthError("Token ID is malformed or invalid")


def local_filesystems(root: Path) -> Callable[[ExecCall], ExecResult]:
    """An `exec_handler` that runs the command for real, each sandbox's files in a directory of
    its own, `root/<sandbox id>`: the command's last argument, a path in the sandbox (where our
    scripts work), is taken under it."""

    def run(call: ExecCall) -> ExecResult:
        *command, where = call.args
        inside = root / call.sandbox_id / where.lstrip("/") if where.startswith("/") else where
        completed = subprocess.run(
            [*command, str(inside)], input=call.stdin, capture_output=True, text=True, timeout=call.timeout
        )
        return ExecResult(completed.returncode, completed.stdout + completed.stderr)

    return run


class _ClientBase:
    credentials: tuple[str, str]


def _module(cloud: FakeModalCloud) -> SimpleNamespace:
    class Client(_ClientBase):
        def __init__(self, credentials: tuple[str, str]) -> None:
            self.credentials = credentials

        @classmethod
        def from_credentials(cls, token_id: str, token_secret: str) -> Client:
            return cls((token_id, token_secret))

        def hello(self):
            cloud.check(self)

        def close(self) -> None:
            cloud.closed_clients += 1

    class App:
        def __init__(self, app_id: str) -> None:
            self.app_id = app_id

        @staticmethod
        def lookup(
            name: str, *, client: Any = None, environment_name: str | None = None, create_if_missing: bool = False
        ) -> App:
            cloud.check(client)
            if name not in cloud.apps:
                if not create_if_missing:
                    raise NotFoundError(f"App '{name}' not found")
                cloud.apps[name] = cloud.new_id("ap")
            return App(cloud.apps[name])

    class Image:
        def __init__(self, resolve: Callable[[], str], client: Any = None) -> None:
            self._resolve = resolve
            self._client = client
            self._object_id: str | None = None

        @property
        def object_id(self) -> str:
            if self._object_id is None:
                raise AttributeError("Attempting to get object_id of unhydrated Image")
            return self._object_id

        @staticmethod
        def from_name(name: str, *, environment_name: str | None = None, client: Any = None) -> Image:
            def resolve() -> str:
                if name not in cloud.published:
                    raise NotFoundError(f"Image '{name}' not found")
                return cloud.published[name]

            return Image(resolve, client)

        @staticmethod
        def from_dockerfile(path: str | Path, *, context_dir: Path | str | None = None) -> Image:
            def resolve() -> str:
                cloud.builds.append(Path(path).read_text())
                return cloud.new_id("im")

            return Image(resolve)

        @classmethod
        def from_id(cls, image_id: str, client: Any = None) -> Image:
            image = cls(lambda: image_id, client)
            image._object_id = image_id
            return image

        def build(self, app: Any = None) -> Image:
            if self._object_id is None:
                self._object_id = self._resolve()
            return self

        def publish(
            self,
            name: str,
            *,
            environment_name: str | None = None,
            experimental_options: dict[str, Any] | None = None,
            client: Any = None,
        ) -> None:
            cloud.check(client)
            cloud.published[name] = self.object_id

    class StreamWriter:
        def __init__(self, call: ExecCall) -> None:
            self._call = call

        def write(self, data: bytes | bytearray | memoryview | str) -> None:
            self._call.stdin += data if isinstance(data, str) else bytes(data).decode()

        def write_eof(self) -> None:
            pass

        def drain(self) -> None:
            pass

    class StreamReader:
        def __init__(self, read: Callable[[], str]) -> None:
            self._read = read

        def read(self) -> str:
            return self._read()

    class ContainerProcess:
        def __init__(self, call: ExecCall) -> None:
            self._call = call
            self._result: ExecResult | None = None
            self.stdin = StreamWriter(call)
            self.stdout = StreamReader(lambda: self._finished().output)

        def _finished(self) -> ExecResult:
            if self._result is None:
                self._result = cloud.exec_handler(self._call)
            return self._result

        def poll(self) -> int | None:
            return self._finished().returncode

        @property
        def returncode(self) -> int | None:
            return None if self._result is None else self._result.returncode

    class Sandbox:
        def __init__(self, record: SandboxRecord, client: Any) -> None:
            self._record = record
            self._client = client  # the one it was created or found with, which modal's calls use

        @property
        def object_id(self) -> str:
            return self._record.id

        @staticmethod
        def create(
            *args: str,
            app: Any = None,
            tags: dict[str, str] | None = None,
            image: Any = None,
            timeout: int | None = 300,
            cpu: float | None = None,
            memory: int | None = None,
            client: Any = None,
        ) -> Sandbox:
            cloud.check(client)
            record = SandboxRecord(
                id=cloud.new_id("sb"),
                app_id=app.app_id,
                image_id=image.object_id,
                tags=dict(tags or {}),
                timeout=timeout,
                cpu=cpu,
                memory=memory,
            )
            cloud.sandboxes[record.id] = record
            cloud.on_sandbox_created(record)
            return Sandbox(record, client)

        @staticmethod
        def from_id(sandbox_id: str, client: Any = None) -> Sandbox:
            cloud.check(client)
            if sandbox_id not in cloud.sandboxes:
                raise NotFoundError(f"Sandbox '{sandbox_id}' not found")
            return Sandbox(cloud.sandboxes[sandbox_id], client)

        @staticmethod
        def list(
            *, app_id: str | None = None, tags: dict[str, str] | None = None, client: Any = None
        ) -> Iterator[Sandbox]:
            cloud.check(client)
            wanted = (tags or {}).items()
            for record in reversed(cloud.running()):
                if (app_id is None or record.app_id == app_id) and wanted <= record.tags.items():
                    yield Sandbox(record, client)

        def get_tags(self) -> dict[str, str]:
            return dict(self._record.tags)

        def set_tags(self, tags: dict[str, str]) -> None:
            """Replaces the whole set, as modal's does."""
            cloud.check(self._client)
            cloud.tag_calls.append((self._record.id, dict(tags)))
            self._record.tags = dict(tags)

        def poll(self) -> int | None:
            return None if self._record.running else 0

        def exec(self, *args: str, timeout: int | None = None) -> ContainerProcess:
            if not self._record.running:
                raise Error("Sandbox has already finished")
            call = ExecCall(self._record.id, args, timeout)
            cloud.execs.append(call)
            return ContainerProcess(call)

        def snapshot_filesystem(self, timeout: int = 55, *, ttl: int | None = 30 * 24 * 3600) -> Image:
            if cloud.snapshot_error is not None:
                raise cloud.snapshot_error
            snapshot_id = cloud.new_id("im-snap")
            cloud.snapshots.append(snapshot_id)
            return Image.from_id(snapshot_id)

        def terminate(self, *, wait: bool = False) -> int | None:
            self._record.running = False
            return 0 if wait else None

    def image_delete(image_id: str, *, client: Any = None) -> None:
        cloud.check(client)
        if image_id in cloud.deleted_images:
            raise NotFoundError(f"Image '{image_id}' not found")
        cloud.deleted_images.append(image_id)

    return SimpleNamespace(
        App=App,
        Client=Client,
        Image=Image,
        Sandbox=Sandbox,
        Error=Error,
        exception=SimpleNamespace(
            Error=Error,
            NotFoundError=NotFoundError,
            AuthError=AuthError,
            ConnectionError=ConnectionError,
            SnapshotCreationError=SnapshotCreationError,
        ),
        experimental=SimpleNamespace(image_delete=image_delete),
        container_process=SimpleNamespace(ContainerProcess=ContainerProcess),
        io_streams=SimpleNamespace(StreamWriter=StreamWriter, StreamReader=StreamReader),
    )
