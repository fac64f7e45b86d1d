"""One schema per event: every domain event has one public document, read back as it was published,
described in the generated catalog; a stored log keeps its bytes; the read model's views are the
aggregate's state.

The registry (`bus.core.publications.PUBLICATIONS`) is keyed by the domain event class, so the events are
found by walking the aggregates, not by a list kept beside them.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import msgspec
import pytest
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, CommandMethodDecorator
from eventsourcing.persistence import StoredEvent

import bb_environments.domain as domain
from bb_environments.bus.core.log_reader import LogReader
from bb_environments.bus.core.publications import PUBLICATIONS, log_decoder
from bb_environments.bus.wire.documents import EnvironmentEvent
from bb_environments.bus.wire.log_only_documents import (
    ClaimEvent,
    HostClaimsEvent,
    PoolEvent,
    PoolListEvent,
    ProjectSecretsEvent,
    RegisteredHostEvent,
    ThreadEvent,
)
from bb_environments.domain.environment import Environment
from bb_environments.domain.host_claims import HostClaims
from bb_environments.domain.leases import PortBlock
from bb_environments.domain.path_claim import PathClaim
from bb_environments.domain.pool import Freshness, Pool, PoolList
from bb_environments.domain.project_secrets import ProjectSecrets
from bb_environments.domain.registered_host import RegisteredHost
from bb_environments.domain.status import HookStatus
from bb_environments.domain.thread import Thread
from bb_environments.entrypoints import catalog
from bb_environments.projections.views import EnvironmentView, ThreadView, environment_view

STORED_LOG = Path(__file__).parent / "data" / "stored_log.jsonl"
"""A log that `record_every_event` wrote before documents came from the registry (commit 584270d):
each stored event, and the subject and payload the relay published for it then."""


def aggregates() -> list[type[Aggregate]]:
    """Every aggregate class of the domain package."""
    for module in pkgutil.iter_modules(domain.__path__):
        importlib.import_module(f"{domain.__name__}.{module.name}")

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    return sorted(
        {c for c in subclasses(Aggregate) if c.__module__.startswith(f"{domain.__name__}.")}, key=lambda c: c.__name__
    )


def recorded_event_classes(aggregate: type[Aggregate]) -> set[type[Aggregate.Event]]:
    """The aggregate's nested event classes. eventsourcing gives every aggregate a default `Created`
    class too; one whose `__init__` records another event never records it, so it is left out."""
    nested = {
        v
        for v in vars(aggregate).values()
        if isinstance(v, type) and issubclass(v, aggregate.Event) and v is not aggregate.Event
    }
    named = {
        getattr(aggregate, m.given_event_cls.__name__ if m.given_event_cls else m.event_cls_name)
        for m in vars(aggregate).values()
        if isinstance(m, CommandMethodDecorator)
    }
    return {c for c in nested if c in named or not issubclass(c, Aggregate.Created)}


ALL_EVENTS = {event for aggregate in aggregates() for event in recorded_event_classes(aggregate)}


def record_every_event(app: Application) -> None:
    """Save a history in which each event of each aggregate happens at least once."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    intent = {
        "type": "provider",
        "environmentProviderId": "git-worktree",
        "machine": {"type": "existing", "hostId": "local"},
        "inputs": {"branch": {"kind": "default"}},
    }
    thread = Thread(thread_id="t-1", project_path="/src/p", parent_thread_id=None, host_id="local", intent=intent)
    thread.request_environment()
    thread.refuse("the path /src/p is held by another environment")
    env = Environment(
        provider_id="git-worktree",
        host_id="local",
        project_path="/src/p",
        inputs={"branch": {"kind": "default"}},
        path_key="t-1-1",
        claimed_path="/data/wt/t-1-1",
        thread_id="t-1",
        slug="p-3f9c",
        ports={"first": 20000, "count": 10},
    )
    claim = PathClaim(host_id="local", path="/data/wt/t-1-1", environment_id=env.id)
    thread.assign_environment(env.id)
    app.save(thread, env, claim)
    host = HostClaims(host_id="local", held={"/data/wt/t-1-1": env.id})
    host.lease(env.id, "p-3f9c", PortBlock(20000, 10))
    app.save(host)
    env.record_create_failed(1, "transient", "git is busy")
    env.record_attempt_cleaned(1)
    env.retry("t-1-2", "/data/wt/t-1-2")
    host.release("/data/wt/t-1-1", env.id)
    host.hold("/data/wt/t-1-2", env.id)
    env.record_created(2, "/data/wt/t-1-2", True, "main", {"worktree": "/data/wt/t-1-2"})
    operation = env.setup_operation()
    env.start_setup(operation)
    env.record_setup_outcome(operation, False, "exit status 3")
    env.retry("t-1-2", "/data/wt/t-1-2")
    operation = env.setup_operation()
    env.start_setup(operation)
    env.record_setup_outcome(operation, True, None)
    env.record_resource({"snapshot": "im-1"})
    env.record_paused({"snapshot": "im-2"}, now)
    env.request_resume()
    env.record_resumed({"sandbox": "sb-2"})
    env.record_disk_usage("/data/wt/t-1-2", 1_234_567)
    env.attach_thread("t-2")
    env.detach_thread("t-2", now, 60_000)
    env.detach_thread("t-1", now, 60_000)
    env.attach_thread("t-3")
    env.detach_thread("t-3", now, 0)
    env.start_removal(now + timedelta(seconds=1))
    env.start_teardown(env.teardown_operation())
    env.record_teardown_outcome(env.teardown_operation(), "failed", "exit status 2")
    env.record_remove_failed(1, "the worktree is locked", now + timedelta(seconds=60))
    env.retry_removal(now + timedelta(seconds=61))
    env.record_removed(2, f"refs/bb/saved/{env.id}")
    claim.release(env.id)
    host.release("/data/wt/t-1-2", env.id)
    host.end_lease(env.id)
    thread.leave_environment()
    thread.archive()
    thread.unarchive()
    app.save(thread, env, claim, host)
    other = Environment(
        provider_id="project-checkout",
        host_id="local",
        project_path="/src/p",
        inputs=None,
        path_key="t-1-3",
        claimed_path="/data/wt/t-1-1",
        thread_id="t-1",
    )
    claim.retake(other.id)
    thread.assign_environment(other.id)
    other.record_created(1, "/data/wt/t-1-1", False, None, None)
    other.skip_setup("the workspace is not the provider's")
    other.record_workspace_vanished("/data/wt/t-1-1")
    app.save(thread, other, claim)
    third = Environment(
        provider_id="personal-workspace",
        host_id="local",
        project_path=None,
        inputs=None,
        path_key="t-4-1",
        claimed_path=None,
        thread_id="t-4",
    )
    third.cancel_for_thread("t-4")
    third.start_removal(now)
    third.skip_teardown("nothing was created")
    third.record_removed(1)
    app.save(third)
    away = Environment(
        provider_id="personal-workspace",
        host_id="h1",
        project_path=None,
        inputs=None,
        path_key="t-5",
        claimed_path=None,
        thread_id="t-5",
        planned=False,
    )
    away.note_host_awaited("waiting for the agent of host 'h1', which has not connected since it was registered")
    away.record_planned(1, None, None, "/hosts/h1/personal/t-5")
    app.save(away)
    registration = RegisteredHost(host_id="h1", public_key="UAH1FIRSTKEY")
    registration.register("UAH1ROTATEDKEY", rotate=True)
    registration.remove()
    registration.register("UAH1AGAINKEY", rotate=False)
    app.save(registration)
    secrets = ProjectSecrets(project_path="/src/p")
    secrets.set("NPM_TOKEN")
    secrets.remove("NPM_TOKEN")
    app.save(secrets)
    pools = PoolList()
    pool = Pool(host_id="local", project_path="/src/p", provider_id="git-worktree", inputs={}, size=2)
    pools.add(pool.id)
    pool.see_base(Freshness("c1", "h1"))
    member = Environment(
        provider_id="git-worktree",
        host_id="local",
        project_path="/src/p",
        inputs={"branch": {"kind": "default"}},
        path_key="pool-1",
        claimed_path="/data/wt/pool-1",
        thread_id="",
        pool_id=str(pool.id),
        base_commit="c1",
        setup_hash="h1",
    )
    pool.add_member(member.id)
    member.record_created(1, "/data/wt/pool-1", True, "main", {"branch": "bb/pool-1"})
    member.start_setup(member.setup_operation())
    member.record_setup_outcome(member.setup_operation_id, True, None)
    pool.record_setup(member.id, True, None, 1, now)
    member.bind("t-6", {"branch": {"kind": "default"}}, "t-6")
    pool.let_go(member.id, "bound")
    pool.add_member(env.id)
    pool.record_setup(env.id, False, "exit status 1", 1, now)
    pool.resume()
    pool.resize(0)
    app.save(pools, pool, member)


@pytest.fixture
def app():
    application = Application(env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    yield application
    application.close()


def test_every_event_of_every_aggregate_has_a_document():
    assert {Environment, Thread, PathClaim} <= set(aggregates())
    missing = sorted(e.__qualname__ for e in ALL_EVENTS - set(PUBLICATIONS))
    assert not missing, f"no public document for {missing}: give it one in bus/core/publications.py"
    assert set(PUBLICATIONS) == ALL_EVENTS
    types = [p.type for p in PUBLICATIONS.values()]
    assert len(set(types)) == len(types), (
        "two documents of the log share a `type`: the log decoder cannot tell them apart"
    )


def test_every_logged_event_round_trips_through_the_log_decoder(app):
    record_every_event(app)
    notifications = app.recorder.select_notifications(start=1, limit=1000)
    recorded = {type(app.mapper.to_domain_event(n)) for n in notifications}
    assert recorded == ALL_EVENTS, (
        f"record_every_event does not record {sorted(e.__qualname__ for e in ALL_EVENTS - recorded)}: add them to it"
    )
    logged = LogReader(app).page(0, 1000)
    assert [n.id for n in notifications] == [entry.notification_id for entry in logged]
    for notification, entry in zip(notifications, logged):
        publication = PUBLICATIONS[type(app.mapper.to_domain_event(notification))]
        assert type(entry.document) is publication.document
        assert log_decoder.decode(entry.payload()) == entry.document
        assert entry.subject.startswith(f"bb.log.{publication.kind}.") and entry.subject.endswith(
            f".{publication.type}"
        )


def test_a_log_stored_before_keeps_its_subjects_and_bytes(app):
    """The relay finds its place in the stream by comparing bytes with the store: a document that
    read differently for an old event would make every restart rewrite the stream."""
    rows = [json.loads(line) for line in STORED_LOG.read_text().splitlines()]
    app.recorder.insert_events(
        [
            StoredEvent(UUID(row["originatorId"]), row["originatorVersion"], row["topic"], row["state"].encode())
            for row in rows
        ]
    )
    logged = LogReader(app).page(0, 1000)
    assert [(entry.subject, entry.payload().decode()) for entry in logged] == [
        (r["subject"], r["payload"]) for r in rows
    ]


def test_each_view_is_its_aggregate_just_after_the_event(app):
    record_every_event(app)
    for entry in LogReader(app).page(0, 1000):
        document, view = entry.document, entry.view
        if isinstance(document, EnvironmentEvent):
            assert isinstance(view, EnvironmentView)
            assert (view.id, view.version, view.status, view.status_message, view.thread_ids, view.updated_at) == (
                document.environment_id,
                document.version,
                document.status,
                document.status_message,
                document.thread_ids,
                document.occurred_at,
            )
        elif isinstance(document, ThreadEvent):
            assert isinstance(view, ThreadView) and view.id == document.thread_id
        else:
            log_only = (ClaimEvent, HostClaimsEvent, RegisteredHostEvent, ProjectSecretsEvent, PoolEvent, PoolListEvent)
            assert isinstance(document, log_only) and view is None


def test_a_hook_the_host_skipped_after_it_started_shows_no_operation():
    env = Environment(
        provider_id="git-worktree",
        host_id="local",
        project_path="/src/p",
        inputs=None,
        path_key="t-1-1",
        claimed_path="/data/wt/t-1-1",
        thread_id="t-1",
    )
    env.record_created(1, "/data/wt/t-1-1", True, None, None)
    env.start_setup(env.setup_operation())
    assert env.record_setup_skipped(env.setup_operation_id, "no .bb-env-setup.sh")
    view = msgspec.to_builtins(environment_view(env))
    assert view["hooks"]["setup"] == {"status": HookStatus.SKIPPED, "operationId": None}
    assert view["status"] == "ready" and view["version"] == 5


def test_every_event_is_in_the_catalog():
    generated = catalog.artifacts()
    for publication in PUBLICATIONS.values():
        assert f"### `{publication.type}`" in generated["events.md"], publication.type
        family = "environments" if publication.kind == "environment" else "log"
        assert f"schemas/{family}/{publication.type}.json" in generated
        if family == "environments":
            assert f"environments.{publication.type}" in json.loads(generated["asyncapi.json"])["channels"]


def test_a_document_is_named_after_its_type_and_its_schema_after_the_type_alone():
    """The class says it is a document, so no document shares a name with an aggregate's event or a
    provider's result; the published schemas keep the names they have always had."""
    generated = catalog.artifacts()
    for publication in PUBLICATIONS.values():
        name = "".join(word.title() for word in publication.type.split("_"))
        assert publication.document.__name__ == f"{name}Document"
        assert catalog.catalog_name(publication.document) == name
        family = "environments" if publication.kind == "environment" else "log"
        schema = json.loads(generated[f"schemas/{family}/{publication.type}.json"])
        assert schema["$ref"] == f"#/$defs/{name}" and schema["$defs"][name]["title"] == name


def test_the_committed_catalog_is_the_generated_one():
    assert catalog.differences() == [], "run `python -m bb_environments.entrypoints.catalog --write` and commit docs/"
