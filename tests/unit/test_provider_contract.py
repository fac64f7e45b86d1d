"""The contract's helpers for providers: `ctx.raise_if_cancelled()` and `translate_errors`."""

from __future__ import annotations

import threading

import pytest

from bb_environments.providers.contract import (
    Cancelled,
    CreateContext,
    CreateFailed,
    CreateResult,
    RemoveContext,
    Removed,
    RemoveFailed,
    RemoveResult,
    translate_errors,
)


class Refused(Exception):
    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def create(raised: BaseException) -> CreateResult:
    with translate_errors(Refused, ValueError) as failed:
        raise raised
    return failed.create_failed()


def test_raise_if_cancelled_raises_only_once_the_event_is_set() -> None:
    cancelled = threading.Event()
    contexts = [
        CreateContext("local", None, None, "/data", cancelled=cancelled),
        RemoveContext("local", "/data", None, None, None, "t1", 1, None, cancelled=cancelled),
    ]
    for context in contexts:
        context.raise_if_cancelled()
    cancelled.set()
    for context in contexts:
        with pytest.raises(Cancelled, match="^cancelled$"):
            context.raise_if_cancelled()


def test_create_failures_name_the_error_and_its_kind() -> None:
    assert create(Cancelled()) == CreateFailed("terminal", "cancelled")
    assert create(Refused("locked", transient=True)) == CreateFailed("transient", "locked")
    assert create(Refused("refused")) == CreateFailed("terminal", "refused")
    assert create(ValueError("bad key")) == CreateFailed("terminal", "bad key")


def test_unexpected_errors_propagate() -> None:
    with pytest.raises(KeyError):
        create(KeyError("bug"))


def test_the_block_s_own_result_is_returned_and_removal_failures_carry_the_message() -> None:
    def remove(raised: BaseException | None) -> RemoveResult:
        with translate_errors(OSError) as failed:
            if raised is not None:
                raise raised
            return Removed()
        return failed.remove_failed()

    assert remove(None) == Removed()
    assert remove(Cancelled()) == RemoveFailed("cancelled")
    assert remove(OSError("disk full")) == RemoveFailed("disk full")
