"""What a failed attempt means: retry it, or fail the job at once; and how to name it.

A :class:`ProviderError` says itself whether it is worth another attempt (a 429 or 5xx is,
a 401 is not); bad input (:class:`InputError`: a missing template variable, a malformed
job) never is; anything else (a timeout, a crash of a stage) is. Errors are described
redacted and bounded, since the description is stored in the job's record.

>>> retryable(ProviderError("503 from upstream", retryable=True))
True
"""

from __future__ import annotations

from ai_lease.errors import InputError, ProviderError
from ai_lease.redaction import redact

__all__ = ["describe", "retryable"]

MAX_DESCRIPTION = 2000


def describe(exc: BaseException) -> str:
    """``Type: message``, redacted (no secret reaches a record) and at most 2000 characters."""
    return redact(f"{type(exc).__name__}: {exc}")[:MAX_DESCRIPTION]


def retryable(exc: BaseException) -> bool:
    """Whether the attempt that raised ``exc`` may be tried again."""
    if isinstance(exc, ProviderError):
        return exc.retryable
    return not isinstance(exc, InputError)
