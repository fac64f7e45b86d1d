"""Which words may be the start of an environment id, to be resolved by the service (as git and
docker resolve a unique start of an id), and which are malformed ids to refuse at once."""

from __future__ import annotations

import pytest

from bb_environments.domain.ids import is_environment_id_prefix

WHOLE = "3f2a9c1e-07bd-4c55-9e0b-5a1d2c3e4f60"


@pytest.mark.parametrize("start", ["3", "3f2a", "3F2A9C1E", "3f2a9c1e-", "3f2a9c1e-07", WHOLE[:-1]])
def test_a_start_of_an_id_as_written_is_a_prefix(start):
    assert is_environment_id_prefix(start)


@pytest.mark.parametrize("word", ["", WHOLE, "12g", "3f2a9c1e0", "-3f2a", "3f2a 9c", "../x", "t1", "3f2a\n"])
def test_a_whole_id_an_empty_word_or_anything_unlike_an_id_is_not(word):
    assert not is_environment_id_prefix(word)
