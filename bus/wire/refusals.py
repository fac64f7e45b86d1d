"""Why a payload was refused, in words that never carry the payload's own text."""

from __future__ import annotations

import re

import msgspec


def refusal_reason(error: msgspec.DecodeError | RecursionError) -> str:
    """Why a payload was refused, without its content: msgspec quotes an offending value (an
    unknown `type`, say), which may be a prompt or a secret; where it was is enough. An unknown
    field is named only when its name reads as one: any other name is the publisher's text, and
    a line break in it would forge a line of our log."""
    reason = re.sub(r"^(Invalid (?:enum )?value) .*?((?: - at `[^`]*`)?)$", r"\1 <withheld>\2", str(error), flags=re.S)
    return re.sub(
        r"^(Object contains unknown field) `(.*?)`((?: - at `[^`]*`)?)$", _name_field_if_a_name, reason, flags=re.S
    )


def _name_field_if_a_name(m: re.Match[str]) -> str:
    return f"{m[1]} `{m[2]}`{m[3]}" if _FIELD_NAME.fullmatch(m[2]) else f"{m[1]} <withheld>{m[3]}"


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
