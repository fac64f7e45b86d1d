"""Inbound thread events are refused on anything they do not declare or that is out of shape."""

from __future__ import annotations

import msgspec
import pytest

from bb_environments.bus.wire.refusals import refusal_reason
from bb_environments.bus.wire.thread_events import ThreadCreatedMessage, inbound_decoder


def created(**fields: object) -> bytes:
    return msgspec.json.encode({"type": "created", "threadId": "t1", **fields})


def reason(data: bytes) -> str:
    with pytest.raises(msgspec.DecodeError) as refused:
        inbound_decoder.decode(data)
    return refusal_reason(refused.value)


@pytest.mark.parametrize(
    "data, where",
    [
        (created(apiKey="s"), "the message holds the field `apiKey`, which it does not allow"),
        (created(environment={"type": "existing", "environmentId": "e", "token": "s"}), "`environment` holds"),
        (
            created(
                environment={"type": "provider", "environmentProviderId": "p", "machine": {"type": "existing", "x": 1}}
            ),
            "`environment.machine` holds the field `x`",
        ),
        (msgspec.json.encode({"type": "message", "threadId": "t1", "text": "hi", "attachment": "s"}), "`attachment`"),
    ],
)
def test_a_field_no_struct_declares_is_refused(data: bytes, where: str) -> None:
    assert where in reason(data)


@pytest.mark.parametrize(
    "fields",
    [
        {"threadId": "../escape"},
        {"threadId": "t" * 129},
        {"threadId": "t1\n"},
        {"parentThreadId": "a b"},
        {"hostId": "-flag"},
        {"projectPath": "/" + "p" * 4096},
    ],
)
def test_ids_and_paths_out_of_shape_are_refused(fields: dict) -> None:
    with pytest.raises(msgspec.ValidationError):
        inbound_decoder.decode(created(**fields))


def test_a_well_formed_event_decodes() -> None:
    assert inbound_decoder.decode(created(hostId="local", projectPath="/repo")) == ThreadCreatedMessage(
        thread_id="t1", host_id="local", project_path="/repo"
    )


def test_a_refusal_reason_withholds_the_offending_value() -> None:
    secret = "SECRET - at `$.x` 'quoted'"
    refused = reason(msgspec.json.encode({"type": secret, "threadId": "t1"}))
    assert refused == "`type` has a value that is not one it allows (the value withheld)"


@pytest.mark.parametrize(
    "data, said",
    [
        (created(threadId="a b"), "`threadId` is not allowed: use 1-128 letters, digits, '-' or '_', starting with"),
        (created(hostId="-flag"), "`hostId` is not allowed: use 1-64 letters, digits, '-' or '_', starting with"),
        (created(threadId=5), "`threadId` must be a string, not an integer"),
        (created(projectPath="/" + "p" * 4096), "`projectPath` must be a string of at most 4096 characters"),
        (msgspec.json.encode({"type": "created"}), "`threadId` is missing; it is required"),
        (created()[:-3], "the message is not complete JSON: it ends too early"),
        (b"[1]", "the message must be an object, not an array"),
        (created(**{"a\nb": 1}), "the message holds a field (its name withheld), which it does not allow"),
    ],
)
def test_a_refusal_names_the_field_what_was_wrong_and_what_is_allowed(data: bytes, said: str) -> None:
    assert reason(data).startswith(said)
