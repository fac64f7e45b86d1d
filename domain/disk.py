"""A workspace's size on disk (SPEC 11): when a new figure is worth recording, and how one reads."""

from __future__ import annotations

DISK_CHANGE_RECORDED = 0.05
"""A workspace's new size is recorded when it differs from the recorded one by more than this share
of it: the recorded figure stays within 5% of the last measured one (SPEC 11 asks 10% of `du -sb`),
and a workspace measured every few minutes for months adds an event only when its size moved."""


def worth_recording(recorded: int | None, measured: int) -> bool:
    return recorded is None or abs(measured - recorded) > recorded * DISK_CHANGE_RECORDED


def human_bytes(count: int) -> str:
    """`count` bytes as `du -h` writes them: 512B, 4.0K, 1.2G (powers of 1024, one decimal under 10)."""
    size = float(count)
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            break
        size /= 1024
    if unit == "B":
        return f"{count}B"
    return f"{size:.1f}{unit}" if size < 10 else f"{size:.0f}{unit}"
