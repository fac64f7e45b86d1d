"""The house's arrows point inwards, and a host agent can be loaded without the core.

`.ci/imports.py` reads the package as installed; these tests hold the tree to its rules and show
that the rules catch an arrow pointing the wrong way.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / ".ci" / "imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_arrow_of_the_installed_package_points_the_wrong_way():
    graph = import_graph()
    assert graph.wrong_way(graph.graph()) == []


def test_the_rules_catch_the_domain_importing_the_service_layer_and_the_agent_loading_the_core():
    graph = import_graph()
    edges = graph.graph()
    edges["bb_environments.domain.environment"].add("bb_environments.handlers.application")
    edges["bb_environments.entrypoints.agent"].add("bb_environments.projections.read_model")
    faults = graph.wrong_way(edges)
    assert (
        "bb_environments.domain.environment -> bb_environments.handlers.application: "
        "domain may not import handlers" in faults
    )
    assert any(
        f.startswith("bb_environments.entrypoints.agent loads bb_environments.projections.read_model") for f in faults
    )
    assert any("loads the library eventsourcing" in f for f in faults)  # through the read model's fold


def test_the_command_prints_the_layers_and_exits_0_when_every_arrow_points_inwards():
    shown = subprocess.run([sys.executable, str(ROOT / ".ci" / "imports.py")], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert any(line.startswith("handlers -> domain (") for line in shown.stdout.splitlines()), shown.stdout
    checked = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "imports.py"), "--check"], capture_output=True, text=True
    )
    assert checked.returncode == 0 and checked.stdout.startswith("no arrow points the wrong way"), checked.stdout


def test_loading_the_host_agent_loads_no_event_store_read_model_or_service_layer():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, bb_environments.entrypoints.agent; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    core = [
        m
        for m in loaded
        if m.split(".")[0] in ("eventsourcing", "aiosqlite")
        or m.startswith(("bb_environments.handlers", "bb_environments.projections", "bb_environments.bus.core"))
    ]
    assert core == []
    assert "bb_environments.bus.agent.host_service" in loaded and "bb_environments.hooks.runner" in loaded


def test_the_rules_catch_the_typed_client_loading_the_service():
    graph = import_graph()
    edges = graph.graph()
    edges["bb_environments.client.client"].add("bb_environments.domain.topics")  # which loads eventsourcing
    edges["bb_environments.client.streams"].add("bb_environments.bus.api_client.nats_client")
    faults = graph.wrong_way(edges)
    assert (
        "bb_environments.client.streams -> bb_environments.bus.api_client.nats_client: "
        "client may not import bus.api_client" in faults
    )
    assert (
        "bb_environments.client loads the library eventsourcing: the typed client keeps no event store "
        "or read model" in faults
    )


def test_loading_the_typed_client_loads_nothing_of_the_service_its_store_or_read_models():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, bb_environments.client; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    service = [
        m
        for m in loaded
        if m.split(".")[0] in ("eventsourcing", "aiosqlite", "click", "git")
        or m.startswith(
            (
                "bb_environments.handlers",
                "bb_environments.projections",
                "bb_environments.bus.core",
                "bb_environments.entrypoints",
                "bb_environments.hooks",
                "bb_environments.providers",
            )
        )
    ]
    assert service == []
    assert "bb_environments.client.client" in loaded and "nats.aio.client" in loaded


def test_the_typed_client_ships_its_py_typed_marker():
    from importlib.resources import files

    assert files("bb_environments.client").joinpath("py.typed").is_file()


def test_loading_every_cli_command_loads_nothing_of_the_service_layer_or_event_store():
    """`bb` reads its errors' exit codes from domain/request_errors.py, not from the core's handlers."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, importlib, pkgutil, bb_environments.entrypoints.bb, "
            "bb_environments.entrypoints.cli as cli\n"
            "for m in pkgutil.iter_modules(cli.__path__): "
            "m.name == '__main__' or importlib.import_module(cli.__name__ + '.' + m.name)\n"
            "print('\\n'.join(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    core = [
        m
        for m in loaded
        if m.split(".")[0] in ("eventsourcing", "aiosqlite")
        or m.startswith(("bb_environments.handlers", "bb_environments.projections", "bb_environments.bus.core"))
    ]
    assert core == []
    assert "bb_environments.entrypoints.cli.environment" in loaded
