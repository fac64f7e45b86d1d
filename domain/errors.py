"""Refusals of the domain: each says what was asked and why it cannot be done now."""


class DomainError(Exception):
    """A command the current state does not allow. Nothing was recorded."""


class IllegalTransition(DomainError):
    pass


class PathAlreadyClaimed(DomainError):
    pass


class ThreadsStillLive(DomainError):
    pass


class UnknownEnvironment(DomainError):
    pass


class UnknownThread(DomainError):
    pass


class UnknownPool(DomainError):
    pass


class LimitReached(DomainError):
    """A new environment would pass a limit on how many may be live at once."""


class HostAlreadyRegistered(DomainError):
    pass
