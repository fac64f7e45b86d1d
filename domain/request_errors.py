"""Errors a request can end in, each with the code the CLI maps to its exit status (SPEC §3): shared by
the core, which answers with them, and the CLI, which loads nothing of the core to read them."""

from __future__ import annotations

EXIT_CODES = {"failed": 1, "refused": 1, "invalid_input": 2, "not_found": 3, "unreachable": 4, "timed_out": 5}
"""Each error code's exit status; `timed_out` is a `--wait` that gave up while the environment goes on."""


def one_line(text: str) -> str:
    """`text` as one line of plain text, each character that would break the line or drive a
    terminal shown escaped, as repr shows it: a refusal quotes what it was sent (a directory's
    name, a field's, a provider's message about either), and it still has to read as one sentence."""
    if text.isprintable():  # nearly always, and long texts are where the loop below is slow
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class RequestError(Exception):
    code = "failed"

    def __init__(self, message: str) -> None:
        message = one_line(message)
        super().__init__(message)
        self.message = message


class InvalidInput(RequestError):
    code = "invalid_input"


class NotFound(RequestError):
    code = "not_found"


class UnknownThreadMessage(NotFound):
    """A thread's message came before its `created` event (or without one)."""


class Refused(RequestError):
    code = "refused"


class Unavailable(RequestError):
    """The service cannot answer now (its read model waits for the bus, say); asked again, it will."""

    code = "unreachable"
