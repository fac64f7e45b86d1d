"""Secrets planted where a careless service would keep them are found nowhere it writes.

Credentials in the service's environment, secrets in fields no thread event declares and one in
a message's text (which this service never needs) are planted; a setup hook dumps its own
environment and its parent's into the transcript. Then every file under the data dir and the
service's log are searched for them.

Stream BB_THREADS is left out of the search: it keeps what publishers sent, prompts included, for
whoever runs the threads' agents. That is its purpose, bounded by its retention limits, which are
checked instead. So is its mirror BB_THREAD_PARTITIONS (the same events under partition subjects),
which keeps them within the same limits.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import msgspec
import pytest

from bb_environments.bus.wire import subjects
from bb_environments.entrypoints.config import THREADS_MAX_AGE_S, THREADS_MAX_BYTES
from tests.integration.conftest import Service, write_hooks

PASSWORD = f"SECRET-password-{uuid.uuid4()}"
SERVICE_CREDENTIALS = {
    "BB_NATS_PASSWORD": PASSWORD,
    "POSTGRES_PASSWORD": f"SECRET-postgres-{uuid.uuid4()}",
    "PGPASSWORD": f"SECRET-libpq-{uuid.uuid4()}",
    "MODAL_TOKEN_SECRET": f"SECRET-modal-{uuid.uuid4()}",
}
NANOSECONDS = 1_000_000_000


def planted(where: str) -> str:
    return f"SECRET-{where}-{uuid.uuid4()}"


def thread_event(kind: str, thread_id: str, **fields: object) -> dict:
    return {"type": kind, "occurredAt": "2026-11-30T12:00:00Z", "threadId": thread_id, **fields}


def worktree_intent(**inputs: object) -> dict:
    return {
        "type": "provider",
        "environmentProviderId": "git-worktree",
        "inputs": {"branch": {"kind": "default"}, **inputs},
    }


THREAD_STREAMS = (subjects.THREADS_STREAM, subjects.THREAD_PARTITIONS_STREAM)


def files_under(root: Path) -> list[Path]:
    return [
        path
        for path in root.rglob("*")
        if path.is_file() and not set(THREAD_STREAMS) & set(path.relative_to(root).parts)
    ]


def threads_stream_limits(data_dir: Path) -> tuple[int, int]:
    """Max age (ns) and max bytes of BB_THREADS and of its mirror (the same), as the nats-server
    stored their configuration."""
    limits = set()
    for stream in THREAD_STREAMS:
        [meta] = data_dir.rglob(f"streams/{stream}/meta.inf")
        config = json.loads(meta.read_text())
        limits.add((config["max_age"], config["max_bytes"]))
    [both] = limits
    return both


@pytest.mark.parametrize("service", [SERVICE_CREDENTIALS], indirect=True)
async def test_planted_secrets_appear_in_no_file_the_service_writes(
    service: Service, git_repo: Path, tmp_path: Path
) -> None:
    write_hooks(
        git_repo, tmp_path / "hooks.log", setup="env\ntr '\\0' '\\n' < /proc/$PPID/environ\necho environment dumped"
    )
    secrets = {where: planted(where) for where in ("beside", "intent", "inputs", "type", "text")}
    project = str(git_repo)
    refused = [
        thread_event(
            "created", "refused-beside", projectPath=project, environment=worktree_intent(), apiKey=secrets["beside"]
        ),
        thread_event(
            "created",
            "refused-intent",
            projectPath=project,
            environment={**worktree_intent(), "token": secrets["intent"]},
        ),
        thread_event(
            "created", "refused-inputs", projectPath=project, environment=worktree_intent(password=secrets["inputs"])
        ),
        thread_event(secrets["type"], "refused-type"),
    ]
    publisher = await service.connect("publisher")
    try:
        js = publisher.jetstream()
        for body in refused:
            await js.publish(subjects.thread_event(body["threadId"], "created"), msgspec.json.encode(body))
        await js.publish(
            subjects.thread_event("kept", "created"),
            msgspec.json.encode(thread_event("created", "kept", projectPath=project, environment=worktree_intent())),
        )
        await js.publish(
            subjects.thread_event("kept", "message"),
            msgspec.json.encode(thread_event("message", "kept", text=f"deploy with {secrets['text']}")),
        )
        await service.thread_events_handled()
        kept = await service.wait_for_thread("kept", having="environmentId")
    finally:
        await publisher.close()
    await service.wait_for(
        kept["environmentId"], lambda e: e["status"] == "ready" and "environment dumped" in e["transcript"]
    )

    listed = (await service.bb("thread", "list", "--json")).json()["threads"]
    assert [thread["id"] for thread in listed] == ["kept"]
    log = (service.data_dir.parent / "serve.log").read_text()
    for body in refused:
        assert f"refused a thread event on {subjects.thread_event(body['threadId'], 'created')}: " in log
    await service.stop()  # so that everything it wrote is on disk

    hook_output = "".join(path.read_text() for path in (service.data_dir / "hooks").rglob("*.log"))
    assert len([line for line in hook_output.splitlines() if line.startswith("PATH=")]) == 2  # both were dumped
    # Of the service's kind, the hook holds only what the core gives it on purpose.
    given = [line for line in hook_output.splitlines() if line.startswith("BB_")]
    assert sorted(line.partition("=")[0] for line in given) == [
        "BB_ENVIRONMENT_ID",
        "BB_ENVIRONMENT_SLUG",
        "BB_PORT",
        "BB_PORTS",
    ]
    assert f"BB_ENVIRONMENT_ID={kept['environmentId']}" in given
    searched = [*files_under(service.data_dir), service.data_dir.parent / "serve.log"]
    found = [
        (secret, str(path))
        for path in searched
        for secret in [*SERVICE_CREDENTIALS.values(), *secrets.values()]
        if secret.encode() in path.read_bytes()
    ]
    assert found == []
    assert threads_stream_limits(service.data_dir) == (THREADS_MAX_AGE_S * NANOSECONDS, THREADS_MAX_BYTES)


async def test_a_stream_created_with_other_limits_gets_the_configured_ones_on_start(service: Service) -> None:
    await service.stop()
    service.environment |= {"BB_THREADS_MAX_AGE_S": "3600", "BB_THREADS_MAX_BYTES": "1048576"}
    await service.start()
    await service.stop()

    assert threads_stream_limits(service.data_dir) == (3600 * NANOSECONDS, 1048576)
