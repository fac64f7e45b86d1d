"""Transcript lines (bb.transcripts.<environmentId>): a step, or a line a provider or hook printed."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from bb_environments.bus.wire.descriptions import said as _said

TranscriptKind = Literal["step", "output"]


class TranscriptLine(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", tag="transcript"):
    """A line of an environment's transcript: a step of its preparation or removal (`kind: step`), or
    a line a provider or hook printed (`kind: output`); `source` names the provider or hook."""

    occurred_at: Annotated[datetime, _said("When the line was written (UTC).")]
    environment_id: Annotated[str, _said("The environment.")]
    kind: Annotated[TranscriptKind, _said("`step`: a step of the work; `output`: a line printed.")]
    source: Annotated[str, _said("Who wrote the line: the core, a provider, or a hook (`setup`, `teardown`).")]
    text: Annotated[str, _said("The line.")]
