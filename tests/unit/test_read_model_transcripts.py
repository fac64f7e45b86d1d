"""The read model keeps the newest transcript lines of each environment (a real SQLite file)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bb_environments.projections.read_model import TRANSCRIPT_LINES_KEPT, ReadModel
from bb_environments.projections.views import TranscriptEntry


@pytest.fixture
async def read_model(tmp_path: Path) -> AsyncIterator[ReadModel]:
    model = await ReadModel.open(tmp_path / "read-models.sqlite")
    yield model
    await model.close()


async def test_a_batch_of_transcript_lines_keeps_the_newest_lines_of_each_environment_it_touches(
    read_model: ReadModel,
) -> None:
    lines = [
        TranscriptEntry(sequence, environment_id, False, f"{environment_id} line {sequence}")
        for sequence, environment_id in enumerate(["a", "b"] * (TRANSCRIPT_LINES_KEPT + 3), start=1)
    ]
    await read_model.add_transcript(lines)
    for environment_id in ("a", "b"):
        kept = await read_model.transcript(environment_id, last=TRANSCRIPT_LINES_KEPT + 10)
        assert kept == [line.text for line in lines if line.environment_id == environment_id][3:]
