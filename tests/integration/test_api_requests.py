"""Raw API requests that are malformed, oversized or carry unknown fields: invalid_input, nothing written."""

from __future__ import annotations

import json

from bb_environments.bus.wire import subjects


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_bad_requests_are_invalid_input_before_anything_is_written(service):
    good = await service.bb(
        "thread", "spawn", "--environment-provider", "personal-workspace", "--thread-id", "good", "--wait"
    )  # a log with something in it to compare
    assert good.returncode == 0, good.stderr
    await service.measured()
    before = (await service.bb("events", "export")).stdout

    spawn = {"environmentProvider": "personal-workspace", "threadId": "t2"}
    cases = [
        ("environments", "show", b"{not json", "malformed request"),
        ("environments", "show", b'{"environmentId": "x"}', "not a valid id"),
        ("environments", "delete", b'{"environmentId": "../x"}', "not a valid id"),
        ("environments", "retry", b'{"environmentId": 5}', "malformed request"),
        ("environments", "list", b'{"colour": "red"}', "holds the field `colour`, which it does not allow"),
        ("environments", "show", b'{"environmentId": "3f', "not complete JSON: it ends too early"),
        ("environments", "retry", b'{"environmentId": 5}', "`environmentId` must be a string, not an integer"),
        ("environments", "providers", b"[]", "malformed request"),
        ("threads", "spawn", json.dumps({**spawn, "threadId": "../t2"}).encode(), "thread id"),
        ("threads", "spawn", json.dumps({**spawn, "parentThreadId": "no such/thread"}).encode(), "thread id"),
        ("threads", "spawn", json.dumps({**spawn, "hostId": "--evil"}).encode(), "host id"),
        ("threads", "spawn", json.dumps({"environmentId": "not-a-uuid", "threadId": "t2"}).encode(), "not a valid id"),
        ("threads", "spawn", json.dumps({**spawn, "sandbox": True}).encode(), "the field `sandbox`"),
        ("threads", "spawn", json.dumps({**spawn, "prompt": "x" * 70_000}).encode(), "at most 65536"),
        (
            "threads",
            "spawn",
            b'{"environmentProvider": "personal-workspace", "threadId": "t2", "environmentInputs": '
            + nested(40)
            + b"}",
            "nest deeper than 32",
        ),
        (
            "threads",
            "spawn",
            b'{"environmentProvider": "personal-workspace", "threadId": "t2", "environmentInputs": '
            + nested(20_000)
            + b"}",
            "nest",
        ),
        ("threads", "archive", b'{"threadId": "a b"}', "thread id"),
        ("threads", "cancel", b'{"threadId": ""}', "thread id"),
        ("threads", "list", b'{"environmentId": "zzz"}', "not a valid id"),
        ("environments", "list", b'{"limit": 0}', "limit"),
        ("environments", "list", b'{"limit": 100000}', "limit"),
        ("environments", "list", b'{"after": "../x"}', "not a valid id"),
        ("threads", "list", b'{"after": "a b"}', "thread id"),
        ("events", "replay", b'{"everything": true}', "the field `everything`, which it does not allow"),
    ]
    nc = await service.connect("operator")
    try:
        for area, verb, payload, mention in cases:
            reply = await nc.request(subjects.api(area, verb), payload, timeout=30)
            code = (reply.headers or {}).get("Nats-Service-Error-Code")
            assert code == "invalid_input", (area, verb, reply.data[:300])
            error = json.loads(reply.data)["error"]
            assert error["code"] == "invalid_input" and mention in error["message"], (area, verb, error)
            # Words for a person: no regex, no decoder's phrase.
            assert not any(raw in error["message"] for raw in ("(?!", "regex", "Input data", "- at `$")), error
    finally:
        await nc.close()

    assert (await service.bb("events", "export")).stdout == before
    assert "Traceback" not in service.log_tail()
