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
        (created(apiKey="s"), "unknown field `apiKey`"),
        (created(environment={"type": "existing", "environmentId": "e", "token": "s"}), "`$.environment`"),
        (
            created(
                environment={"type": "provider", "environmentProviderId": "p", "machine": {"type": "existing", "x": 1}}
            ),
            "`$.environment.machine`",
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
    assert refused == "Invalid value <withheld> - at `$.type`"
