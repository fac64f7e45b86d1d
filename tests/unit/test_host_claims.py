"""A command changes a copy of its host's HostClaims: whatever it holds or releases there, the
cached aggregate it was copied from keeps the claims it had, nested-path rule included. A host's
claims grow for ever: on a shared store they are snapshotted, and load from the snapshot."""

from __future__ import annotations

from copy import deepcopy
from uuid import uuid4

import pytest

from bb_environments.domain.errors import PathAlreadyClaimed
from bb_environments.domain.host_claims import HostClaims, host_claims_id
from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.claiming import HOST_CLAIMS_SNAPSHOT_INTERVAL
from bb_environments.handlers.writers import SharedStore


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


def test_a_hosts_claims_are_snapshotted_and_another_replica_loads_them_from_the_snapshot(tmp_path):
    store = event_store_environment(f"sqlite:///{tmp_path / 'events.sqlite'}")
    writer = Environments(env=store, writers=SharedStore())
    held = {}
    for n in range(HOST_CLAIMS_SNAPSHOT_INTERVAL):  # Started and Held, then one Held each
        claims = writer.claims.on_host("h1")
        held[f"/w/{n}"] = environment_id = uuid4()
        claims.take(f"/w/{n}", environment_id)
        writer.save(*claims.changed)
    writer.close()

    replica = Environments(env=store, writers=SharedStore())
    assert replica.snapshots is not None
    snapshots = list(replica.snapshots.get(host_claims_id("h1"), desc=True, limit=1))
    assert [snapshot.originator_version for snapshot in snapshots] == [HOST_CLAIMS_SNAPSHOT_INTERVAL]
    loaded = replica.repository.get(host_claims_id("h1"))
    assert loaded.version == HOST_CLAIMS_SNAPSHOT_INTERVAL + 1
    assert loaded.paths.holders() == held
    with pytest.raises(PathAlreadyClaimed):
        loaded.hold("/w/0/inner", uuid4())  # the nested-path rule holds on what the snapshot restored
    replica.close()


def test_a_single_writer_keeps_no_snapshots(tmp_path):
    app = Environments(env=event_store_environment(f"sqlite:///{tmp_path / 'events.sqlite'}"))
    assert app.snapshots is None  # every lookup of an aggregate not cached would query them for nothing
    app.close()
