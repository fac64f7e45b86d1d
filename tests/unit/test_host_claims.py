"""A command changes a copy of its host's HostClaims: whatever it holds or releases there, the
cached aggregate it was copied from keeps the claims it had, nested-path rule included."""

from __future__ import annotations

from copy import deepcopy
from uuid import uuid4

import pytest

from bb_environments.domain.errors import PathAlreadyClaimed
from bb_environments.domain.host_claims import HostClaims


def test_a_copy_of_a_hosts_claims_changes_without_changing_the_original():
    first, second = uuid4(), uuid4()
    cached = HostClaims(host_id="h1", held={"/w/a": first, "/w/b/": second})
    cached.collect_events()

    changed = deepcopy(cached)
    changed.release("/w/a", first)
    changed.release("/w/b/", second)
    changed.hold("/w/a/inner", second)

    assert cached.paths.holders() == {"/w/a": first, "/w/b/": second}
    with pytest.raises(PathAlreadyClaimed):
        cached.hold("/w/a/inner", second)  # still inside /w/a, which the original holds
    with pytest.raises(PathAlreadyClaimed):
        cached.hold("/w/b/c", first)  # inside /w/b/, held by the other
    assert changed.paths.holders() == {"/w/a/inner": second}
    changed.hold("/w/b/c", first)
