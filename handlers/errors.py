"""Errors a request can end in, each with the code the CLI maps to its exit status (SPEC §3)."""

from __future__ import annotations

EXIT_CODES = {"failed": 1, "refused": 1, "invalid_input": 2, "not_found": 3, "unreachable": 4}


class RequestError(Exception):
    code = "failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(RequestError):
    code = "invalid_input"


class NotFound(RequestError):
    code = "not_found"


class Refused(RequestError):
    code = "refused"
