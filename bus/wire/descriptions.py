"""How a wire struct's field says what it holds, in its JSON Schema."""

import msgspec


def said(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)
