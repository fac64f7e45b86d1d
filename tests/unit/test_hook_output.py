"""How much of a hook's output its log keeps: the bound, cut lines, and the markers saying so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bb_environments.entrypoints.config import ConfigError, hook_output_max_bytes
from bb_environments.hooks.output_log import LINE_MAX_BYTES, BoundedLog


def written(path: Path, max_bytes: int, *chunks: bytes) -> bytes:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    log = BoundedLog(fd, max_bytes)
    for chunk in chunks:
        log.write(chunk)
    log.settle()
    log.close()
    return path.read_bytes()


def test_output_within_the_bound_is_kept_as_it_came(tmp_path):
    assert written(tmp_path / "log", 1 << 20, b"one\ntw", b"o\nthree") == b"one\ntwo\nthree"


def test_a_line_longer_than_the_limit_keeps_its_start_and_says_how_much_was_cut(tmp_path):
    long_line = b"x" * (LINE_MAX_BYTES + 5000)
    kept = written(tmp_path / "log", 1 << 20, b"before\n", long_line[:7000], long_line[7000:] + b"\nafter\n")
    lines = kept.split(b"\n")
    assert lines[0] == b"before" and lines[2] == b"after"
    assert lines[1] == b"x" * LINE_MAX_BYTES + b" [bb: line cut, 5000 more bytes of it not kept]"


def test_output_beyond_the_bound_is_counted_not_kept_and_the_log_says_how_much(tmp_path):
    output = b"y" * 99 + b"\n"
    kept = written(tmp_path / "log", 64 * 1024, *[output * 100] * 30)  # 300,000 bytes
    assert len(kept) <= 64 * 1024
    content = kept[: kept.index(b"\n[bb:")]  # cut mid-line: the marker starts a line of its own
    assert (output * 3000).startswith(content) and len(content) > 60_000
    *_, marker, end = kept.split(b"\n")
    assert end == b""
    dropped = 300_000 - len(content)
    assert marker == f"[bb: {dropped} bytes of output not kept: beyond BB_HOOK_OUTPUT_MAX_BYTES (65536 bytes)]".encode()


@pytest.mark.parametrize("raw", ["12", "lots", "-1", "65535"])
def test_a_hook_output_bound_below_its_minimum_or_not_a_number_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("BB_HOOK_OUTPUT_MAX_BYTES", raw)
    with pytest.raises(ConfigError, match="BB_HOOK_OUTPUT_MAX_BYTES .* at least 65536"):
        hook_output_max_bytes()


def test_hook_output_is_bounded_at_eight_mebibytes_unless_configured(monkeypatch):
    monkeypatch.delenv("BB_HOOK_OUTPUT_MAX_BYTES", raising=False)
    assert hook_output_max_bytes() == 8 * 1024 * 1024
    monkeypatch.setenv("BB_HOOK_OUTPUT_MAX_BYTES", "100000")
    assert hook_output_max_bytes() == 100_000
