"""What a replica takes of another's secret values (handlers/secrets.py): only what the shared log
records as the newest set, and a removal only once the log records it; a replica that lacks a
value fetches it; a store written before values carried their set time still reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bb_environments.entrypoints.event_store import event_store_environment
from bb_environments.handlers.application import Environments
from bb_environments.handlers.secrets import Secrets, SecretsLacking, SharedSecret
from bb_environments.handlers.store import Store
from bb_environments.providers.host.secret_store import SecretStore, StoredSecret


class Beside:
    """The other replicas, reached in process."""

    def __init__(self) -> None:
        self.others: list[Secrets] = []

    async def tell(self, change: SharedSecret) -> None:
        for other in self.others:
            await other.received(change)

    async def held(self, project_path: str) -> tuple[list[SharedSecret], bool]:
        return [secret for other in self.others for secret in await other.shareable(project_path)], True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(Environments(env=event_store_environment(f"sqlite:///{tmp_path / 'events.sqlite'}")))
    yield store
    store.close()


def replica(store: Store, directory: Path, *others: Secrets) -> tuple[Secrets, Beside]:
    beside = Beside()
    beside.others.extend(others)
    return Secrets(store, SecretStore(directory), peers=beside), beside


async def test_a_set_and_a_removal_reach_the_other_replica_and_a_late_one_fetches_the_value(
    store: Store, tmp_path: Path, git_repo: Path
) -> None:
    b, _ = replica(store, tmp_path / "b")
    a, _ = replica(store, tmp_path / "a", b)
    project, entry = await a.set(str(git_repo), "API_TOKEN", "one")
    assert SecretStore(tmp_path / "b").entries(project) == {"API_TOKEN": StoredSecret("one", entry.set_at.isoformat())}

    c, _ = replica(store, tmp_path / "c", a)
    await c.fetch_lacking()
    assert SecretStore(tmp_path / "c").values(project) == {"API_TOKEN": "one"}

    await a.remove(project, "API_TOKEN")
    assert SecretStore(tmp_path / "b").values(project) == {}


async def test_a_value_the_log_does_not_hold_as_newest_and_a_removal_it_does_not_record_are_ignored(
    store: Store, tmp_path: Path, git_repo: Path
) -> None:
    a, _ = replica(store, tmp_path / "a")
    project, entry = await a.set(str(git_repo), "API_TOKEN", "one")
    b, _ = replica(store, tmp_path / "b")
    await b.received(SharedSecret(project, "API_TOKEN", "forged", entry.set_at - timedelta(seconds=1)))
    await b.received(SharedSecret(project, "OTHER", "forged", entry.set_at))
    assert SecretStore(tmp_path / "b").values(project) == {}
    await b.received(SharedSecret(project, "API_TOKEN", "one", entry.set_at))
    await b.received(SharedSecret(project, "API_TOKEN", None))  # the log still records it
    assert SecretStore(tmp_path / "b").values(project) == {"API_TOKEN": "one"}


def test_a_store_written_before_values_had_their_set_time_still_reads(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put("/p", "API_TOKEN", "one")
    next(tmp_path.iterdir()).write_text(json.dumps({"API_TOKEN": "old"}))
    assert store.entries("/p") == {"API_TOKEN": StoredSecret("old", None)}
    store.put("/p", "OTHER", "two", "2026-01-01T00:00:00+00:00")
    assert store.values("/p") == {"API_TOKEN": "old", "OTHER": "two"}


class Unanswering:
    """Another replica present that gives no answer in time."""

    async def tell(self, change: SharedSecret) -> None:
        return None

    async def held(self, project_path: str) -> tuple[list[SharedSecret], bool]:
        return [], False


async def test_a_replica_lacking_a_value_gives_a_hook_no_partial_set_until_the_others_have_answered(
    store: Store, tmp_path: Path, git_repo: Path
) -> None:
    a, _ = replica(store, tmp_path / "a")
    project, _ = await a.set(str(git_repo), "API_TOKEN", "one")
    app = store.app
    app.register_thread("t1", project, None, "local", None)
    environment = app.claim_environment("t1", "git-worktree", "local", project, {}, "t1", str(tmp_path / "wt"))
    app.record_created(environment.id, 1, str(tmp_path / "wt"), True, "main", None)
    app.start_setup(environment.id)
    operation = app.environment(environment.id).setup_operation_id

    cut_off = Secrets(store, SecretStore(tmp_path / "b"), peers=Unanswering())
    with pytest.raises(SecretsLacking):
        await cut_off.for_hook(operation, "local")
    b, _ = replica(store, tmp_path / "b", a)
    assert await b.for_hook(operation, "local") == {"API_TOKEN": "one"}
    nobody_has_it, _ = replica(store, tmp_path / "c")
    assert await nobody_has_it.for_hook(operation, "local") == {}  # every other replica answered
