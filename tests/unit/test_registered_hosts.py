"""The host registry (SPEC 7.1) as the log keeps it: one RegisteredHost per host id, with its agent's
public key, which every core replica on the store reads the same.

The replicas are Environments on one SQLite file, as tests/replicas/test_shared_store.py builds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bb_environments.domain.errors import HostAlreadyRegistered
from bb_environments.domain.registered_host import RegisteredHost, registered_host_id
from bb_environments.handlers.application import Environments
from bb_environments.handlers.store import Store
from bb_environments.handlers.writers import SingleWriter
from tests.replicas.test_shared_store import before_next_save, replica


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Environments, Environments]]:
    a, b = replica(f"sqlite:///{tmp_path / 'events.sqlite'}"), replica(f"sqlite:///{tmp_path / 'events.sqlite'}")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Environments]:
    single = replica(f"sqlite:///{tmp_path / 'events.sqlite'}", SingleWriter())
    yield single
    single.close()


def recorded(host: RegisteredHost) -> list[type]:
    return [type(event) for event in host.collect_events()]


def test_registering_a_registered_host_is_refused_unless_its_credentials_are_rotated():
    host = RegisteredHost(host_id="h1", public_key="UKEY1")
    with pytest.raises(HostAlreadyRegistered, match=r"^host 'h1' is registered already$"):
        host.register("UKEY2", rotate=False)
    host.register("UKEY2", rotate=True)
    host.register("UKEY2", rotate=True)  # the same rotation again: nothing more to record
    assert host.public_key == "UKEY2" and not host.removed
    assert recorded(host) == [RegisteredHost.Registered, RegisteredHost.CredentialsRotated]


def test_a_removed_host_may_be_registered_again_with_a_new_key():
    host = RegisteredHost(host_id="h1", public_key="UKEY1")
    host.remove()
    host.remove()  # removed already: nothing more to record
    assert host.removed
    host.register("UKEY2", rotate=False)
    assert host.public_key == "UKEY2" and not host.removed
    assert recorded(host) == [RegisteredHost.Registered, RegisteredHost.Removed, RegisteredHost.RegisteredAgain]


def test_each_host_has_one_registration_whatever_its_key():
    first, second = (RegisteredHost(host_id="h1", public_key=key) for key in ("UKEY1", "UKEY2"))
    assert first.id == second.id == registered_host_id("h1") != registered_host_id("h2")


def test_the_registry_lists_the_hosts_registered_now_as_the_log_has_them(app: Environments, tmp_path: Path):
    app.hosts.register("h2", "UKEY2", rotate=False)
    app.hosts.register("h1", "UKEY1", rotate=False)
    app.hosts.remove("h2")
    head = app.head()
    with pytest.raises(HostAlreadyRegistered):
        app.hosts.register("h1", "UKEY3", rotate=False)
    app.hosts.remove("h2")
    assert app.head() == head  # refused, or removed already: nothing recorded
    assert app.hosts.registered() == ["h1"]
    app.close()
    reopened = replica(f"sqlite:///{tmp_path / 'events.sqlite'}", SingleWriter())
    try:
        assert reopened.hosts.registered() == ["h1"]
    finally:
        reopened.close()


def test_seed_files_the_log_never_heard_of_are_recorded_once_and_a_removed_host_stays_removed(app: Environments):
    app.hosts.register("gone", "UKEYGONE", rotate=False)
    app.hosts.remove("gone")
    seeded = {"gone": "UKEYGONE", "h1": "UKEY1", "h2": "UKEY2"}
    app.hosts.register_seeded(seeded)
    head = app.head()
    app.hosts.register_seeded(seeded)  # a start again, after a kill -9 or not
    assert app.head() == head
    assert app.hosts.registered() == ["h1", "h2"]
    assert app.repository.get(registered_host_id("h1")).public_key == "UKEY1"


def test_a_host_registered_through_one_replica_is_known_removed_and_registered_again_through_the_other(replicas):
    a, b = replicas
    assert b.hosts.registered() == []  # b has read the log up to here
    a.hosts.register("h1", "UKEY1", rotate=False)
    assert b.hosts.registered() == ["h1"]
    with pytest.raises(HostAlreadyRegistered):
        b.hosts.register("h1", "UKEY2", rotate=False)
    b.hosts.register("h1", "UKEY2", rotate=True)
    assert a.repository.get(registered_host_id("h1")).public_key == "UKEY2"
    b.hosts.remove("h1")
    assert a.hosts.registered() == []
    a.hosts.register("h1", "UKEY3", rotate=False)
    assert b.hosts.registered() == ["h1"]
    assert b.repository.get(registered_host_id("h1")).public_key == "UKEY3"


async def test_two_replicas_registering_one_new_host_at_once_register_it_once(replicas):
    a, b = replicas
    store = Store(a)
    try:
        # b registers it between a's decision and a's save: a's save conflicts, and its command,
        # run again, finds the host registered.
        before_next_save(a, lambda: b.hosts.register("h1", "UKEYB", rotate=False))
        with pytest.raises(HostAlreadyRegistered):
            await store.run(a.hosts.register, "h1", "UKEYA", False)
    finally:
        store.close()
    host = b.repository.get(registered_host_id("h1"))
    assert (host.public_key, host.version) == ("UKEYB", 1)
