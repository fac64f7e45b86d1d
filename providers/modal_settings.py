"""Settings, credentials and the Dockerfile of the `modal-sandbox` provider.

Settings come from `<provider data dir>/settings.json` (camelCase keys), overridden by the
environment (`BB_MODAL_IDLE_PAUSE_MINUTES`, `BB_MODAL_DOCKERFILE`, `BB_MODAL_APP_NAME`). The Modal
token comes from `MODAL_TOKEN_ID` / `MODAL_TOKEN_SECRET` only: we never write it anywhere, and
settings.json refuses unknown keys, so a token pasted there is refused rather than used.

The Dockerfile used is, first found: the `dockerfile` setting, the copy `bb modal image set` stored
in the data dir, the one shipped in `providers/modal_image/`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import msgspec

from bb_environments.providers.host.durable_files import write_durably

PROVIDER_ID = "modal-sandbox"
DEFAULT_APP_NAME = "bb-environments"
SETTINGS_FILE = "settings.json"
STORED_DOCKERFILE = "Dockerfile"
# Package data (pyproject's [tool.setuptools.package-data]): found where the package is installed.
# A real file, since its directory is the build context of COPY and ADD.
SHIPPED_DOCKERFILE = Path(str(resources.files(__package__) / "modal_image" / "Dockerfile"))
IMAGE_NAME_PREFIX = "bb-standard"
MAX_IDLE_PAUSE_MINUTES = 1440
MAX_DOCKERFILE_CHARS = 65_536
# Modal object names: letters, digits, '-', '_', '.', at most 64 characters.
APP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
NO_CREDENTIALS = "Modal credentials are not configured: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"
DOCKERFILE_INSTRUCTIONS = frozenset(
    {
        "FROM",
        "RUN",
        "COPY",
        "ADD",
        "ENV",
        "ARG",
        "WORKDIR",
        "USER",
        "LABEL",
        "EXPOSE",
        "ENTRYPOINT",
        "CMD",
        "SHELL",
        "VOLUME",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "ONBUILD",
    }
)

DockerfileSource = Literal["setting", "data-dir", "shipped"]


class SettingsError(ValueError):
    """Settings the provider refuses; the message names the setting and the rule."""


class DockerfileError(ValueError):
    def __init__(self, source: str, line_number: int, text: str, rule: str) -> None:
        super().__init__(f"{source} line {line_number}: {text!r} {rule}")
        self.line_number = line_number
        self.text = text


class ModalSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    idle_pause_minutes: int = 15
    """Pause a sandbox after this many idle minutes; 0 disables idle pausing."""
    dockerfile: str | None = None
    app_name: str = DEFAULT_APP_NAME


@dataclass(frozen=True)
class Credentials:
    token_id: str
    token_secret: str = field(repr=False)

    @property
    def hint(self) -> str:
        return token_hint(self.token_id)

    @property
    def secrets(self) -> tuple[str, str]:
        return (self.token_id, self.token_secret)


@dataclass(frozen=True)
class Dockerfile:
    text: str
    source: DockerfileSource
    path: Path
    """Where the text was read; its directory is the build context for COPY and ADD."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def image_name(self) -> str:
        return f"{IMAGE_NAME_PREFIX}:{self.sha256}"


def provider_data_dir(service_data_dir: Path) -> Path:
    """The directory the core gives this provider (`providers.workspaces.provider_dir`)."""
    return service_data_dir / "providers" / PROVIDER_ID


def load_settings(data_dir: str | Path) -> ModalSettings:
    path = Path(data_dir) / SETTINGS_FILE
    try:
        settings = msgspec.json.decode(path.read_bytes(), type=ModalSettings)
    except FileNotFoundError:
        settings = ModalSettings()
    except (msgspec.ValidationError, msgspec.DecodeError) as bad:
        raise SettingsError(f"{path} is not valid Modal settings: {bad}") from None
    settings = msgspec.structs.replace(
        settings,
        idle_pause_minutes=_env_int("BB_MODAL_IDLE_PAUSE_MINUTES", settings.idle_pause_minutes),
        dockerfile=os.environ.get("BB_MODAL_DOCKERFILE") or settings.dockerfile,
        app_name=os.environ.get("BB_MODAL_APP_NAME") or settings.app_name,
    )
    if not 0 <= settings.idle_pause_minutes <= MAX_IDLE_PAUSE_MINUTES:
        raise SettingsError(
            f"idlePauseMinutes must be between 0 and {MAX_IDLE_PAUSE_MINUTES}, got {settings.idle_pause_minutes}"
        )
    if not APP_NAME_PATTERN.fullmatch(settings.app_name):
        raise SettingsError(f"appName {settings.app_name!r} must be 1-64 letters, digits, '.', '-' or '_'")
    return settings


def credentials_from_env() -> Credentials | None:
    token_id = os.environ.get("MODAL_TOKEN_ID", "").strip()
    token_secret = os.environ.get("MODAL_TOKEN_SECRET", "").strip()
    if not token_id or not token_secret:
        return None
    return Credentials(token_id, token_secret)


def token_hint(token_id: str) -> str:
    return f"{token_id[:4]}…"


def effective_dockerfile(data_dir: str | Path, settings: ModalSettings) -> Dockerfile:
    """The Dockerfile creates build from, validated; DockerfileError names the line at fault."""
    if settings.dockerfile is not None:
        return read_dockerfile(Path(settings.dockerfile).expanduser(), "setting")
    stored = Path(data_dir) / STORED_DOCKERFILE
    if stored.is_file():
        return read_dockerfile(stored, "data-dir")
    return read_dockerfile(SHIPPED_DOCKERFILE, "shipped")


def read_dockerfile(path: Path, source: DockerfileSource) -> Dockerfile:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"cannot read the Dockerfile {path}: {error}") from None
    validate_dockerfile(text, str(path))
    return Dockerfile(text=text, source=source, path=path.resolve())


def store_dockerfile(data_dir: str | Path, source_path: Path) -> Dockerfile:
    """Validate `source_path` and keep a copy as the data dir's Dockerfile; invalid input changes nothing."""
    read_dockerfile(source_path, "data-dir")
    target = Path(data_dir) / STORED_DOCKERFILE
    target.parent.mkdir(parents=True, exist_ok=True)
    write_durably(target, source_path.read_bytes())
    return read_dockerfile(target, "data-dir")


def reset_dockerfile(data_dir: str | Path) -> bool:
    """Forget the stored Dockerfile; True when there was one."""
    try:
        (Path(data_dir) / STORED_DOCKERFILE).unlink()
    except FileNotFoundError:
        return False
    return True


def validate_dockerfile(text: str, source: str = "Dockerfile") -> None:
    """Every instruction must be a known one and the first (after ARGs) a FROM with an image.

    Heredocs (`RUN <<EOF`) are not understood: their body lines are refused as unknown instructions.
    """
    if len(text) > MAX_DOCKERFILE_CHARS:
        raise SettingsError(f"{source} is longer than {MAX_DOCKERFILE_CHARS} characters")
    seen_from = False
    for line_number, instruction in _logical_lines(text, source):
        keyword, _, arguments = instruction.partition(" ")
        keyword = keyword.upper()
        if keyword not in DOCKERFILE_INSTRUCTIONS:
            raise DockerfileError(source, line_number, instruction, "does not start with a known instruction")
        if seen_from or keyword == "ARG":
            continue
        if keyword != "FROM":
            raise DockerfileError(source, line_number, instruction, "comes before FROM (only ARG may)")
        if not arguments.strip():
            raise DockerfileError(source, line_number, instruction, "names no image")
        seen_from = True
    if not seen_from:
        raise SettingsError(f"{source} has no FROM instruction")


def _logical_lines(text: str, source: str) -> list[tuple[int, str]]:
    """Instructions with the number of the line each starts on: continuations joined, comments dropped."""
    instructions: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        instructions.append((start, " ".join(part for part in pending if part)))
        pending = []
    if pending:
        raise DockerfileError(source, start, " ".join(pending), "ends with a line continuation and no instruction")
    return instructions


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number of minutes, got {raw!r}") from None
