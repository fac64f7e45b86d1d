"""Why a payload was refused, in words that never carry the payload's own text."""

from __future__ import annotations

import re

import msgspec

from bb_environments.domain.ids import HOST_ID_PATTERN, HOST_ID_RULE, ID_PATTERN, ID_RULE

_RULES = {ID_PATTERN: ID_RULE, HOST_ID_PATTERN: HOST_ID_RULE}
"""What each pattern the wire checks allows, as the CLI says it: a regex is no answer for a person."""

_KINDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "null": "null",
    "object": "an object",
    "array": "an array",
}

_WHERE = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


def refusal_reason(error: msgspec.DecodeError | RecursionError) -> str:
    """Why a payload was refused, in a sentence naming the field, what was wrong and what is
    allowed, without the payload's content: msgspec quotes an offending value (an unknown `type`,
    say), which may be a prompt or a secret; where it was is enough. An unknown field is named
    only when its name reads as one: any other name is the publisher's text, and a line break in
    it would forge a line of our log."""
    if isinstance(error, RecursionError):
        return "the message nests objects and arrays too deeply"
    found = _WHERE.fullmatch(str(error))
    assert found is not None  # the pattern matches any text
    what, path = found["what"], (found["path"] or "").removeprefix(".")
    field = f"`{path}`" if path else "the message"
    if what == "Input data was truncated":
        return "the message is not complete JSON: it ends too early"
    if what.startswith("JSON is malformed"):  # where: "invalid character (byte 1)"
        return what.replace("JSON is malformed", "the message is not valid JSON", 1)
    if m := re.fullmatch(r"Expected `(\w+)`, got `(\w+)`", what):
        return f"{field} must be {_KINDS.get(m[1], m[1])}, not {_KINDS.get(m[2], m[2])}"
    if m := re.fullmatch(r"Expected `str` matching regex '(.*)'", what, flags=re.S):
        rule = _RULES.get(m[1].replace("\\\\", "\\"))
        return f"{field} is not allowed: use {rule}" if rule else f"{field} is not in the form allowed"
    if m := re.fullmatch(r"Expected `(\w+)` of length ([<>]=) (\d+)", what):
        limit = "at most" if m[2] == "<=" else "at least"
        unit = "characters" if m[1] == "str" else "items"
        return f"{field} must be {_KINDS.get(m[1], m[1])} of {limit} {m[3]} {unit}"
    if m := re.fullmatch(r"Expected `(\w+)` ([<>]=?) (\S+)", what):
        return f"{field} must be {_KINDS.get(m[1], m[1])} {m[2]} {m[3]}"
    if m := re.fullmatch(r"Object missing required field `(\w+)`", what):
        return f"`{path + '.' if path else ''}{m[1]}` is missing; it is required"
    if m := re.fullmatch(r"Object contains unknown field `(.*)`", what, flags=re.S):
        named = f"the field `{m[1]}`" if _FIELD_NAME.fullmatch(m[1]) else "a field (its name withheld)"
        return f"{field} holds {named}, which it does not allow"
    if re.match(r"Invalid (enum )?value", what):
        return f"{field} has a value that is not one it allows (the value withheld)"
    # Any other refusal msgspec words: its words, the value it may quote withheld.
    withheld = re.sub(r"'.*'|`.*`", "<withheld>", what, flags=re.S)
    return f"{field}: {withheld}"
