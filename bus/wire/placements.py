"""Placement outcomes (bb.placements.<threadId>.<status>): where each thread stands, once per
thread and environment."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from bb_environments.bus.wire.descriptions import said as _said

PlacementStatus = Literal["ready", "error", "refused"]


class PlacementOutcome(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", tag="placement"):
    """Where a thread stands: `ready` when the environment it is on is ready for it (a new one, or
    one it joined that was ready already), `error` when that environment failed for good,
    `refused` when its event was refused. Published once per thread and environment on
    `bb.placements.<threadId>.<status>` (stream `BB_PLACEMENTS`); a thread placed again later gets
    a new one."""

    occurred_at: Annotated[datetime, _said("When the outcome came about (UTC).")]
    thread_id: Annotated[str, _said("The thread.")]
    environment_id: Annotated[str | None, _said("The environment the thread is on, or null when it got none.")]
    status: Annotated[PlacementStatus, _said("`ready`, `error` or `refused`; also the subject's last token.")]
    reason: Annotated[
        str | None,
        _said(
            "Why it was refused, or why its environment failed, in one sentence (as `bb thread list` shows a "
            "refusal): never the event's prompt or payload, only a value the reason is about (a provider "
            "that does not exist, say); null when ready."
        ),
    ]
