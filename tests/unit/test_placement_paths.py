"""Workspace paths in bb's data dir are claimed by where they really are, however they are named."""

from __future__ import annotations

import os
from pathlib import Path

from bb_environments.handlers.placement import Placer
from bb_environments.providers.registry import ProviderRegistry


def test_a_data_dir_reached_through_a_link_claims_the_real_paths(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "providers" / "personal-workspace").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    placer = Placer(ProviderRegistry([]), tmp_path / "link")
    planned = tmp_path / "link" / "providers" / "personal-workspace" / "t1"
    assert placer.canonical_path(str(planned)) == str(real / "providers" / "personal-workspace" / "t1")
    planned.mkdir()  # created by its provider since: still the same path
    assert placer.canonical_path(str(planned)) == str(real / "providers" / "personal-workspace" / "t1")


def test_a_workspace_that_is_a_link_claims_its_target(tmp_path: Path) -> None:
    (tmp_path / "data" / "providers" / "p").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    placer = Placer(ProviderRegistry([]), tmp_path / "data")
    placer.canonical_path(str(tmp_path / "data" / "providers" / "p" / "first"))  # its directory now resolved
    (tmp_path / "data" / "providers" / "p" / "w").symlink_to(tmp_path / "elsewhere")
    for alias in ("w", "w/", "../p/w", "./w"):
        path = os.path.join(tmp_path, "data", "providers", "p", alias)
        assert placer.canonical_path(path) == str(tmp_path / "elsewhere"), alias


def test_paths_outside_the_data_dir_and_non_local_ones_are_resolved_as_before(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "project")
    placer = Placer(ProviderRegistry([]), tmp_path / "data")
    assert placer.canonical_path(str(tmp_path / "alias" / "sub")) == str(tmp_path / "project" / "sub")
    assert placer.canonical_path("modal://sandbox/1") == "modal://sandbox/1"
