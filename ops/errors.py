"""The one error type for known failures: a reason and a hint the user can act on, and an exit code."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The CLI's exit codes; the bot maps them to its own replies."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    REFUSED = 3


class OpsError(Exception):
    """A failure we understand: `reason` says what happened, `hint` what to do next.

    Never put a secret in either: both reach chat and logs.
    """

    code: ExitCode = ExitCode.FAILED

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.reason} ({self.hint})" if self.hint else self.reason


class BadInput(OpsError):
    """The request itself is wrong: unknown cluster, bad flag, malformed file."""

    code = ExitCode.BAD_INPUT


class Refused(OpsError):
    """The request is valid but not allowed now: protected cluster, others' jobs, unfinished restart."""

    code = ExitCode.REFUSED
