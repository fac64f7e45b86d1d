#!/usr/bin/env python3
"""The import graph of bb_environments as installed, and the direction its arrows must point.

    python .ci/imports.py            # layer -> layer arrows, with how many imports make each
    python .ci/imports.py --modules  # module -> module arrows
    python .ci/imports.py --check    # only the arrows that point the wrong way; exit 1 if any

Import-graph tools read the tree as it lies on disk, where pyproject's package-dir mapping hides
every `bb_environments.*` import. This finds each package where the installed distribution puts it
(an editable install or a wheel alike), reads every module's imports with `ast` (imports inside
functions included: a lazy import is an arrow too), and names each module's layer by its folder.
Run it in the project's venv.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

PACKAGE = "bb_environments"
ROOT = Path(__file__).resolve().parent.parent

# Which layers each layer may import (besides itself). A layer is a top-level folder, or a folder
# of bus/ (its top-level modules are the layer "bus": NATS infrastructure every role shares), or
# providers/host: the operating-system helpers every layer but the domain may use, importing none.
ALLOWED: dict[str, frozenset[str]] = {
    "domain": frozenset(),
    "providers.host": frozenset(),
    "providers": frozenset({"domain"}),
    "hooks": frozenset({"domain", "providers"}),
    "projections": frozenset({"domain"}),
    "handlers": frozenset({"domain", "providers", "projections"}),
    # The wire carries the provider contract's own messages to and from a host's agent.
    "bus.wire": frozenset({"domain", "providers"}),
    "bus": frozenset({"domain", "providers", "bus.wire"}),
    "bus.api_client": frozenset({"domain", "providers", "bus", "bus.wire"}),
    "bus.agent": frozenset({"domain", "providers", "hooks", "bus", "bus.wire"}),
    "bus.core": frozenset({"domain", "providers", "hooks", "projections", "handlers", "bus", "bus.wire", "bus.agent"}),
    "client": frozenset({"domain", "bus.wire"}),
    "entrypoints": frozenset(
        {
            "domain",
            "providers",
            "hooks",
            "projections",
            "handlers",
            "bus",
            "bus.wire",
            "bus.agent",
            "bus.core",
            "bus.api_client",
        }
    ),
}

AGENT_ROOT = f"{PACKAGE}.entrypoints.agent"
AGENT_MAY_NOT_LOAD = ("handlers", "projections", "bus.core")
"""A host agent shares nothing with the core but the bus: none of the core's layers in its closure..."""
AGENT_MAY_NOT_LOAD_LIBRARIES = ("eventsourcing", "aiosqlite")
"""...and neither the event store's library nor the read models'."""
CLIENT_ROOT = f"{PACKAGE}.client"
CLIENT_MAY_NOT_LOAD = ("handlers", "projections", "bus.core", "bus.agent", "bus.api_client", "entrypoints")
"""The typed client loads the wire and nats-py: an integrator's service carries none of bb's own
layers, nor its store's or read models' libraries (AGENT_MAY_NOT_LOAD_LIBRARIES)."""


def modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, with its file."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found: dict[str, Path] = {}
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"{package} is not installed here: run this in the project's venv")
        folder = Path(next(iter(spec.submodule_search_locations)))
        for file in sorted(folder.glob("*.py")):
            found[package if file.stem == "__init__" else f"{package}.{file.stem}"] = file
    return found


def imports_of(name: str, file: Path, known: Iterable[str]) -> Iterator[str]:
    """The modules of the package (and the outside libraries, as their top-level name) `name` imports."""
    names = set(known)
    package = name if file.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from package import module` names a module; `from module import name` names the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.startswith(PACKAGE + "."):
                while target not in names and "." in target:
                    target = target.rpartition(".")[0]
                if target in names:
                    yield target
            elif target != PACKAGE:
                yield target.split(".")[0]


def layer(module: str) -> str:
    parts = module.removeprefix(PACKAGE + ".").split(".")
    if parts[0] in ("bus", "providers") and len(parts) > 2:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: set(imports_of(name, file, found)) for name, file in found.items()}


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    """Every arrow the layering forbids, and whatever the agent's import closure must not hold."""
    faults = []
    for source, targets in sorted(edges.items()):
        for target in sorted(t for t in targets if t in edges):
            here, there = layer(source), layer(target)
            if here != there and there not in ALLOWED[here] and not (there == "providers.host" and here != "domain"):
                faults.append(f"{source} -> {target}: {here} may not import {there}")
    for root, layers, what in (
        (AGENT_ROOT, AGENT_MAY_NOT_LOAD, "a host agent"),
        (CLIENT_ROOT, CLIENT_MAY_NOT_LOAD, "the typed client"),
    ):
        for module in sorted(_closure(edges, root)):
            if module in edges and layer(module) in layers:
                faults.append(f"{root} loads {module}: {what} imports nothing of the core")
            elif module in AGENT_MAY_NOT_LOAD_LIBRARIES:
                faults.append(f"{root} loads the library {module}: {what} keeps no event store or read model")
    return faults


def _closure(edges: dict[str, set[str]], root: str) -> set[str]:
    """Every module (and outside library) importing `root` loads."""
    closure, waiting = set(), [root]
    while waiting:
        module = waiting.pop()
        if module not in closure:
            closure.add(module)
            waiting.extend(edges.get(module, ()))
    return closure


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="module -> module arrows instead of layers")
    parser.add_argument("--check", action="store_true", help="print only wrong-way arrows; exit 1 if any")
    arguments = parser.parse_args(argv)
    edges = graph()
    if arguments.check:
        faults = wrong_way(edges)
        print("\n".join(faults) if faults else f"no arrow points the wrong way ({len(edges)} modules)")
        return 1 if faults else 0
    if arguments.modules:
        for source, targets in sorted(edges.items()):
            for target in sorted(t for t in targets if t in edges):
                print(f"{source.removeprefix(PACKAGE + '.')} -> {target.removeprefix(PACKAGE + '.')}")
        return 0
    arrows = Counter((layer(s), layer(t)) for s, targets in edges.items() for t in targets if t in edges)
    for (here, there), count in sorted(arrows.items()):
        if here != there:
            print(f"{here} -> {there} ({count})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
