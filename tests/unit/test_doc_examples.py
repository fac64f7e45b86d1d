"""Every Python example in README and docs/ is a file the suite runs (examples/), shown whole or
as one of its regions (`# [name]` ... `# [/name]`), so no example in the docs can rot: each block
says which file it is, on the line before it, and equals that file's text."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!-- example: (?P<source>[^ ]+) -->\n)?```python\n(?P<code>.*?)```", re.DOTALL)


def example_text(source: str) -> str:
    """A file of examples/, or the region `name` of it (`path#name`), dedented."""
    path, _, region = source.partition("#")
    text = (ROOT / path).read_text()
    if not region:
        return text
    found = re.search(
        rf"^[ \t]*# \[{re.escape(region)}\]\n(.*?)^[ \t]*# \[/{re.escape(region)}\]\n", text, re.DOTALL | re.MULTILINE
    )
    assert found, f"{path} has no region {region}"
    return textwrap.dedent(found.group(1))


def python_blocks() -> list[tuple[str, str | None, str]]:
    return [
        (
            f"{document.relative_to(ROOT)}:{document.read_text()[: found.start()].count(chr(10)) + 1}",
            found["source"],
            found["code"],
        )
        for document in DOCUMENTS
        for found in _BLOCK.finditer(document.read_text())
    ]


@pytest.mark.parametrize(("where", "source", "code"), python_blocks(), ids=lambda value: str(value)[:40])
def test_every_python_block_of_the_docs_is_an_example_file_the_suite_runs(where, source, code):
    assert source is not None, f"{where}: name the example file on the line before (<!-- example: examples/... -->)"
    assert source.startswith("examples/"), f"{where}: {source} is not under examples/"
    assert code == example_text(source), f"{where} differs from {source}"


def test_the_rule_finds_blocks_and_regions():
    assert len(python_blocks()) >= 8
    assert example_text("examples/integrating/with_nats_py.py#connect").startswith("with open(")
