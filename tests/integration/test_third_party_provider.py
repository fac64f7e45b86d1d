"""A provider installed as a separate package, and providers that misbehave.

The example package in `examples/bb-scratch-provider` is pip-installed into a throwaway target
directory; the service finds it only through that directory's dist-info entry point. Broken
providers are loaded with BB_EXTRA_PROVIDERS and must fail their environment, not the service.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.integration.conftest import Service, service_environment

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "bb-scratch-provider"


def install_example(tmp_path: Path) -> Path:
    """pip-install the example into `tmp_path/site`; return that directory.

    The source is copied first: an in-tree build would leave `build/` and `*.egg-info` in the repo.
    """
    source = tmp_path / "bb-scratch-provider"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path / "site"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, f"pip install failed (is setuptools installed?):\n{completed.stderr}"
    return site


def with_pythonpath(environment: dict[str, str], *directories: Path) -> dict[str, str]:
    environment["PYTHONPATH"] = os.pathsep.join([*map(str, directories), environment["PYTHONPATH"]])
    return environment


async def test_an_installed_package_provider_is_listed_created_validated_and_removed(tmp_path):
    site = install_example(tmp_path)
    entry_points = next(site.glob("bb_scratch_provider-*.dist-info")) / "entry_points.txt"
    assert "scratch = bb_scratch_provider:ScratchProvider" in entry_points.read_text()
    environment = with_pythonpath(service_environment(tmp_path / "data"), site)
    assert "BB_EXTRA_PROVIDERS" not in environment
    service = Service(tmp_path / "data", environment)
    await service.start()
    try:
        listed = (await service.bb("environment", "providers", "--json")).json()["providers"]
        scratch = next(p for p in listed if p["id"] == "scratch")
        assert scratch["displayName"] == "Scratch directory"
        assert scratch["availability"] == {"status": "ready", "reason": None}
        # The grace in force: the tests' service runs with BB_RETIRE_GRACE_MS=0, which replaces the declared 60 s.
        assert scratch["policy"] == {"pathKeys": "per-attempt", "retireGraceMs": 0, "children": "own", "pool": False}
        template = scratch["inputs"]["$defs"]["ScratchInputs"]["properties"]["template"]
        assert template["enum"] == ["empty", "readme"] and template["default"] == "empty"

        spawned = await service.bb(
            "thread",
            "spawn",
            "--json",
            "--environment-provider",
            "scratch",
            "--environment-inputs",
            '{"template": "readme"}',
            "--thread-id",
            "t1",
            "--wait",
        )
        assert spawned.returncode == 0, spawned.stderr
        assert spawned.json()["status"] == "ready"
        environment_id = spawned.json()["environmentId"]
        shown = await service.show(environment_id)
        path = Path(shown["path"])
        assert path == (tmp_path / "data" / "providers" / "scratch" / "scratch" / "t1-1").resolve()
        assert shown["ownsPath"] is True and shown["pathKey"] == "t1-1"
        assert (path / "README.md").read_text().startswith("# Scratch space for t1")

        refused = await service.bb(
            "thread",
            "spawn",
            "--json",
            "--environment-provider",
            "scratch",
            "--environment-inputs",
            '{"template": "fancy"}',
            "--thread-id",
            "t2",
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        message = refused.json()["error"]["message"]
        assert "template" in message and "empty" in message and "readme" in message

        archived = await service.bb("thread", "archive", "t1")
        assert archived.returncode == 0, archived.stderr
        await service.wait_for(environment_id, "removed", timeout=20)
        assert not path.exists()
    finally:
        await service.stop()


BROKEN_PROVIDERS = """
from bb_environments.providers.contract import READY, Policy, Removed, Requires


class _Broken:
    display_name = "Broken"
    requires = Requires()
    policy = Policy(path_keys="per-attempt", retire_grace_ms=0)
    inputs_type = None

    def availability(self, ctx):
        return READY

    def validate(self, ctx):
        pass

    def planned_path(self, ctx, path_key):
        return None

    def remove(self, ctx):
        return Removed()


class RaisingProvider(_Broken):
    id = "raising"

    def create(self, ctx):
        raise RuntimeError("boom")


class NonsenseProvider(_Broken):
    id = "nonsense"

    def create(self, ctx):
        return "ok"
"""


async def test_a_provider_that_raises_or_answers_nonsense_fails_its_environment_not_the_service(tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "broken_providers.py").write_text(textwrap.dedent(BROKEN_PROVIDERS))
    environment = with_pythonpath(
        service_environment(
            tmp_path / "data", BB_EXTRA_PROVIDERS="broken_providers:RaisingProvider,broken_providers:NonsenseProvider"
        ),
        modules,
    )
    service = Service(tmp_path / "data", environment)
    await service.start()
    try:
        for provider, thread_id, expected in (("raising", "t1", "boom"), ("nonsense", "t2", "invalid create result")):
            spawned = await service.bb(
                "thread", "spawn", "--json", "--environment-provider", provider, "--thread-id", thread_id, "--wait"
            )
            assert spawned.returncode == 1, spawned.stdout + spawned.stderr
            failed = await service.show(spawned.json()["environmentId"])
            assert failed["status"] == "error"
            assert f"'{provider}' provider" in failed["statusMessage"] and expected in failed["statusMessage"]

        assert service.process.poll() is None
        healthy = await service.bb(
            "thread", "spawn", "--json", "--environment-provider", "personal-workspace", "--thread-id", "t3", "--wait"
        )
        assert healthy.returncode == 0, healthy.stderr
        assert Path((await service.show(healthy.json()["environmentId"]))["path"]).is_dir()
    finally:
        await service.stop()
