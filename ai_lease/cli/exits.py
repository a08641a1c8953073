"""The ``ai-lease`` exit codes, and which error ends a command with which.

0 done, 1 job failed (a cancelled job too), 2 bad input (config, job file, arguments, a key
reused with another payload), 3 timed out (any timeout: a stream's first-token, idle or
total budget, a stage's hard deadline, the job's deadline — also when the job ended FAILED
for it), 4 store unavailable, missing (a command that only looks never creates one) or
corrupt, 130 interrupted (SIGINT or SIGTERM: a foreground job's lease released, the job
left to workers or cancelled).
"""

from __future__ import annotations

from ai_lease.errors import (
    AiLeaseError,
    InputError,
    JobConflict,
    JobFailed,
    StageTimeout,
    StoreError,
)
from ai_lease.failure import FailureKind, kept_kind

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TIMED_OUT, EXIT_STORE = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def exit_code(exc: AiLeaseError) -> int:
    """The exit code a command that raised ``exc`` ends with."""
    if isinstance(exc, InputError | JobConflict):
        return EXIT_BAD_INPUT
    if isinstance(exc, StageTimeout):
        return EXIT_TIMED_OUT
    if isinstance(exc, JobFailed) and kept_kind(exc.kind, exc.reason) == FailureKind.TIMED_OUT:
        return EXIT_TIMED_OUT  # what ended the job, as a code (named by its error if not given)
    if isinstance(exc, StoreError):
        return EXIT_STORE
    return EXIT_FAILED
