"""A secret's value never reaches a hook's log, however the hook's writes cut it (SPEC 11)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from bb_environments.hooks.output_log import SecretMask

SECRETS = [b"hunter2-token", b"abab", b"x"]


def masked_whole(stream: bytes, secrets: list[bytes]) -> bytes:
    longest_first = sorted(secrets, key=len, reverse=True)
    return re.sub(b"|".join(map(re.escape, longest_first)), b"***", stream)


def masked_in_pieces(pieces: list[bytes], secrets: list[bytes]) -> bytes:
    mask = SecretMask(secrets)
    return b"".join(mask.feed(piece) for piece in pieces) + mask.flush()


def test_a_value_split_across_two_writes_is_masked() -> None:
    assert masked_in_pieces([b"token: hunter2", b"-token\n"], SECRETS) == b"token: ***\n"


def test_what_only_looks_like_a_value_start_is_written_once_it_is_not_one() -> None:
    mask = SecretMask([b"hunter2-token"])
    assert mask.feed(b"hello hun") == b"hello "
    assert mask.feed(b"gry\n") == b"hungry\n"


def test_no_secrets_change_nothing() -> None:
    mask = SecretMask([b""])
    assert mask.feed(b"plain") == b"plain"
    assert mask.flush() == b""


@given(
    st.lists(st.sampled_from([b"hunter2-token", b"abab", b"ab", b"a", b"hunter", b"-token", b"\n", b"z"]), max_size=30),
    st.lists(st.integers(min_value=0, max_value=60), max_size=8),
)
def test_any_cut_of_the_stream_masks_as_the_whole_would(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    bounds = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    pieces = [stream[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]
    secrets = [b"hunter2-token", b"abab"]
    assert masked_in_pieces(pieces, secrets) == masked_whole(stream, secrets)
