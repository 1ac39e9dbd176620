"""The exceptions of the pynox package."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ._result import ErrorInfo, Result


class PynoxError(Exception):
    """The base class of every exception this package raises."""


class PoolError(PynoxError):
    """The pool process could not start, failed, or closed before it
    answered. Every request waiting when the pool stops, and every later
    one, raises it."""


class BinaryNotFoundError(PoolError):
    """The pynox binary is neither where PYNOX_BIN says nor on PATH. The
    message says how to install it."""


class RequestError(PynoxError):
    """The pool refused a request before running anything: an unknown
    field, a wrong type, a grant beyond the pool's ceiling, a session step
    that carries permissions, a full session queue. The code did not run.
    result holds the pool's answer."""

    def __init__(self, result: Result) -> None:
        self.result = result
        message = result.error.message if result.error is not None else "the pool refused the request"
        super().__init__(message)


class JobError(PynoxError):
    """Raised by Result.check() when the job ran but did not succeed: the
    code raised, exited non-zero, timed out, was killed, or could not be
    confined. result holds the whole answer and error its error, if any."""

    def __init__(self, result: Result) -> None:
        self.result = result
        self.error: Optional[ErrorInfo] = result.error
        if result.error is not None:
            message = str(result.error)
        else:
            message = "the job exited with status %d" % result.exit
        super().__init__(message)
