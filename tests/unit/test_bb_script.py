"""The `bb` console script (entrypoints/bb.py): the command runs with the cycle collector on."""

import gc

import pytest

from bb_environments.entrypoints import bb, cli


def test_the_command_runs_with_the_collector_on_and_the_imports_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    # Off for good, `bb serve` would never collect a cycle in its whole life, and no other test would tell.
    seen: list[tuple[bool, bool]] = []
    monkeypatch.setattr(cli, "main", lambda: seen.append((gc.isenabled(), gc.get_freeze_count() > 0)))
    try:
        bb.main()
    finally:
        gc.unfreeze()  # this test process's objects, frozen at the script's exit
    assert seen == [(True, True)]
