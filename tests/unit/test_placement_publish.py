"""Placement outcomes (bus/core/placements.py) as two replicas publish them at the same moment."""

from __future__ import annotations

import time

import pytest
from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.errors import APIError, BadRequestError

from bb_environments.bus.core.placements import DUPLICATE_IN_PROCESS, Placements


class ClusteredStream:
    """nats-py's JetStream publish, as a clustered BB_PLACEMENTS answers it: the first publish
    refused with `refusals` (one per publish), then every message id stored once."""

    def __init__(self, *refusals: APIError) -> None:
        self.refusals = list(refusals)
        self.stored: dict[str, bytes] = {}
        self.asked = 0

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> PubAck:
        self.asked += 1
        if self.refusals:
            raise self.refusals.pop(0)
        message_id = headers["Nats-Msg-Id"]
        duplicate = message_id in self.stored
        self.stored.setdefault(message_id, payload)
        return PubAck(stream="BB_PLACEMENTS", seq=len(self.stored), duplicate=duplicate or None)


def refused_event(sequence: int) -> Msg:
    """A thread event as delivered a moment ago: its metadata is read from the reply subject."""
    reply = f"$JS.ACK.BB_THREADS.c.1.{sequence}.1.{time.time_ns()}.0"
    return Msg(_client=None, subject="bb.threads.t1.created", reply=reply)  # type: ignore[arg-type]


async def test_an_outcome_the_other_replica_is_storing_is_published_again_not_failed():
    in_process = BadRequestError(
        code=409, err_code=DUPLICATE_IN_PROCESS, description="duplicate message id is in process"
    )
    stream = ClusteredStream(in_process)
    placements = Placements(stream, None)  # type: ignore[arg-type]  # a refusal at the edge reads no store
    await placements.refused_at_edge("t1", "not allowed", refused_event(7))
    assert stream.asked == 2 and list(stream.stored) == ["t1:-:refused:event-7"]


async def test_any_other_refusal_of_an_outcome_is_the_callers_to_retry():
    stream = ClusteredStream(BadRequestError(code=400, err_code=10054, description="maximum messages exceeded"))
    with pytest.raises(BadRequestError):
        await Placements(stream, None).refused_at_edge("t1", "not allowed", refused_event(7))  # type: ignore[arg-type]
    assert stream.asked == 1 and not stream.stored
