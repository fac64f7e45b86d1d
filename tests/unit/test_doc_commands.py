"""What README and docs/ tell a reader to run is what runs: README's two commands are the demo
(tests/integration/test_demo.py runs demo.sh) and exactly CI's, every `bb` command and option
README and docs/cli.md name exists, every bench command docs/benchmarks.md gives takes its
options, and every link between the documents leads to a file and heading that are there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from bb_environments.entrypoints.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(document: Path, language: str) -> list[str]:
    """The document's fenced blocks in `language` ("" for those that name none)."""
    return [
        code
        for found_language, code in re.findall(r"^```(\w*)\n(.*?)^```", document.read_text(), re.DOTALL | re.MULTILINE)
        if found_language == language
    ]


def test_readmes_first_commands_run_the_demo_and_exactly_what_ci_runs():
    demo, tests, *_ = blocks(ROOT / "README.md", "sh")
    assert demo == "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && ./demo.sh\n"
    assert (ROOT / "demo.sh").stat().st_mode & 0o111, "demo.sh is run as ./demo.sh"
    assert tests in (ROOT / ".ci" / "run").read_text(), ".ci/run runs README's test command"
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300, "README is read in five minutes"


def command_lines() -> list[str]:
    """Each command of docs/cli.md's synopsis and of README's short list, its continuation lines
    joined to it, without comments."""
    lines: list[str] = []
    for document in (ROOT / "docs" / "cli.md", ROOT / "README.md"):
        for line in blocks(document, "")[0].splitlines():
            if line.startswith(" ") and lines:
                lines[-1] += line
            else:
                lines.append(line.split("#")[0])
    return lines


def subcommand(group: click.Command, name: str) -> click.Command | None:
    """`group`'s command `name` (a lazy group loads it only when asked)."""
    if not isinstance(group, click.Group):
        return None
    return group.get_command(click.Context(group), name)


def resolve(group: click.Command, words: list[str]) -> tuple[click.Command, list[str]]:
    """The command the words name, from `group`, and the words after its name."""
    command = group
    while words and (found := subcommand(command, words[0])) is not None:
        command, words = found, words[1:]
    return command, words


def alternatives(line: str) -> list[list[str]]:
    """The line's words, split at each `|` between commands (not at one between options in [ ])."""
    return [part.split() for part in re.split(r"\|(?![^\[]*\])", line)]


@pytest.mark.parametrize("line", command_lines())
def test_every_command_and_option_of_the_cli_reference_exists(line):
    group: click.Command = cli  # what a segment after a `|` continues from: `bb environment` ... `| list`
    for words in alternatives(line):
        if words[0] == "bb":
            start, words = cli, words[1:]
            group = subcommand(cli, words[0]) or cli
        else:
            start = group
        command, rest = resolve(start, words)
        assert command is not start or words[0].startswith("-"), f"{line}: {words} names no command"
        assert command is cli or not isinstance(command, click.Group), f"{line}: {words} names a group"
        known = {name for parameter in command.params for name in parameter.opts + parameter.secondary_opts}
        options = {word.strip("[]") for word in rest if word.strip("[").startswith("-")} - {"|"}
        assert options <= known, f"{line}: {command.name} has no {options - known}"


def bench_commands() -> list[str]:
    return [
        line.split("#")[0].split()
        for block in blocks(ROOT / "docs" / "benchmarks.md", "sh")
        for line in block.splitlines()
        if line.startswith("python bench/")
    ]


@pytest.mark.parametrize("words", bench_commands(), ids=" ".join)
def test_every_bench_command_of_the_benchmarks_page_takes_its_options(words):
    script, *arguments = words[1:]
    assert (ROOT / script).is_file(), script
    helped = subprocess.run(
        [sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    assert all(option in helped.stdout for option in arguments if option.startswith("--")), helped.stdout


def anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links() -> list[tuple[str, str]]:
    return [
        (f"{document.relative_to(ROOT)}", target)
        for document in DOCUMENTS
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", document.read_text(), flags=re.S))
        if not re.match(r"[a-z]+:", target)
    ]


@pytest.mark.parametrize(("document", "target"), links())
def test_every_link_between_the_documents_leads_somewhere(document, target):
    path, _, fragment = target.partition("#")
    found = (ROOT / document).parent / path if path else ROOT / document
    assert found.exists(), f"{document}: {target} is not there"
    if fragment:
        headings = re.findall(r"^#+ (.*)$", found.read_text(), re.MULTILINE)
        assert fragment in {anchor(heading) for heading in headings}, f"{document}: {target} has no such heading"


def test_the_rules_find_what_they_check():
    assert len(command_lines()) >= 10 and len(bench_commands()) >= 5 and len(links()) >= 30
    assert anchor("Retention: what is kept, and for how long") == "retention-what-is-kept-and-for-how-long"
