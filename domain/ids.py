"""The form of the ids that people and agents choose, apart from the aggregates that hold them: the
CLI checks an id with it before it sends anything, without loading the domain."""

# (?!\n): Python's `$` also matches before a trailing newline; JSON Schema's does not.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}(?!\n)$"
"""Thread ids: one subject token and part of a file name."""
ID_RULE = "1-128 letters, digits, '-' or '_', starting with a letter or digit"

HOST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(?!\n)$"
"""Host ids: at most 64 characters (SPEC 7.1), starting as a thread id does. The one rule of every
checker: a host id that config let through and placement refused made every spawn on it invalid."""
HOST_ID_RULE = "1-64 letters, digits, '-' or '_', starting with a letter or digit"

_UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
"""An environment id as it is written (str of a UUID): what a prefix of one must begin like."""


def is_environment_id_prefix(text: str) -> bool:
    """Whether `text` may be the start of an environment id as written (hex digits, in either case,
    and dashes where a UUID has them), shorter than a whole one: what an operator copies from a
    listing, as git and docker take a unique start of an id."""
    return 0 < len(text) < len(_UUID_SHAPE) and all(
        character == "-" if shape == "-" else character in "0123456789abcdefABCDEF"
        for character, shape in zip(text, _UUID_SHAPE)
    )


QUOTED_LENGTH = 100


def quoted(text: str) -> str:
    """`text` as an error message names it: its repr, cut to its first characters, so that a
    100 KB id sent to be refused is not printed back whole."""
    if len(text) <= QUOTED_LENGTH:
        return repr(text)
    return f"{text[:QUOTED_LENGTH]!r}… ({len(text)} characters)"
