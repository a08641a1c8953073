"""Every error ai_lease raises, in one tree.

Grouped by what the caller will do about it::

    AiLeaseError
    ├── LeaseError                 the lease is not (or no longer) yours: stop, do not write
    │   ├── LeaseLost              a renewal was refused or the lease lapsed
    │   ├── FencingRejected        a write carried a stale (token, owner) fence
    │   └── Stalled                the job made no progress within its stage budget
    ├── JobConflict                the same key was submitted with a different payload
    ├── JobFailed                  the job ended FAILED (after its last attempt)
    │   └── JobCancelled           the job was cancelled by key: it has no result
    ├── StageTimeout               a budget ran out
    │   ├── StageDeadlineExceeded  a stage ran past its hard deadline
    │   ├── JobDeadlineExceeded    the whole job ran past its total deadline
    │   ├── FirstTokenTimeout      a stream made no progress in time
    │   ├── StreamIdleTimeout      a stream went quiet between progress
    │   └── StreamTotalTimeout     a stream ran past its total budget
    ├── ProviderError              the model call failed (``retryable`` says whether to retry)
    │   ├── StreamInterrupted      the stream ended without a finish reason: retried, never a result
    │   ├── EmptyEventStream       a 200 event stream with no events at all (not retried)
    │   ├── EmptyAnswer            the model's answer has no text and no tool call (not retried)
    │   ├── RequestRefused         a 500/501 saying the request itself is invalid (sent once more)
    │   ├── PoolTimeout            no free connection in time: the process is at its limit
    │   └── StreamLimitExceeded    an event or the answer outgrew its size limit (not retried)
    ├── StoreError                 the lease store could not answer
    │   ├── StoreUnavailable       unreachable or timed out: the outcome may be unknown
    │   │   └── OutcomeUnknown     a write was sent, its answer lost: check ``status KEY``
    │   ├── StoreDataLost          the store lost its data (Redis restarted without AOF)
    │   ├── StoreMissing           a store opened only to look does not exist: nothing made
    │   └── CorruptRecord          a stored value (job, worker, histogram) is not ours
    └── InputError                 fix the input and try again; nothing was changed
        ├── ConfigError            a bad setting, naming the field and the rule
        └── JobSpecError           a bad job file or job spec

Messages say what happened and what to do; they never carry secrets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ai_lease.redaction import redact
from ai_lease.refusal import FenceLike, Refusal

__all__ = [
    "AiLeaseError",
    "ConfigError",
    "CorruptRecord",
    "EmptyAnswer",
    "EmptyEventStream",
    "FencingRejected",
    "FirstTokenTimeout",
    "InputError",
    "JobCancelled",
    "JobConflict",
    "JobDeadlineExceeded",
    "JobFailed",
    "JobSpecError",
    "LeaseError",
    "LeaseLost",
    "OutcomeUnknown",
    "PoolTimeout",
    "ProviderError",
    "RequestRefused",
    "StageDeadlineExceeded",
    "StageTimeout",
    "Stalled",
    "StoreDataLost",
    "StoreError",
    "StoreMissing",
    "StoreUnavailable",
    "StreamIdleTimeout",
    "StreamInterrupted",
    "StreamLimitExceeded",
    "StreamTotalTimeout",
]


class AiLeaseError(Exception):
    """The root of every error ai_lease raises."""

    def __str__(self) -> str:
        # Provider errors quote server bodies, which may echo the key: mask it here, once.
        return redact(super().__str__())

    def __reduce__(self) -> tuple[Any, ...]:
        # Every error crosses a process boundary whole (process isolation pickles it), even
        # one whose __init__ takes keyword-only arguments: rebuilt from its args and fields.
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


def _rebuilt(cls: type[AiLeaseError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


class LeaseError(AiLeaseError):
    """The caller does not (or no longer) hold the job's lease."""


class LeaseLost(LeaseError):
    """A renewal was refused or the lease lapsed; local work must stop. ``refusal`` is the
    store's reason when the store refused a renewal (see :meth:`refused`), None when the
    owner stopped on its own (self-fenced, its keeper stopped); ``code`` is the refusal's
    value, or ``"local"`` without one."""

    def __init__(
        self,
        key: str,
        reason: str,
        held: FenceLike | None = None,
        *,
        refusal: Refusal | None = None,
    ) -> None:
        self.key, self.reason, self.held, self.refusal = key, reason, held, refusal
        self.code: str = "local" if refusal is None else refusal.value
        token = f" (token {held.token})" if held else ""
        super().__init__(f"lease for job {key!r}{token} lost: {reason}")

    @classmethod
    def refused(cls, held: FenceLike, refusal: Refusal | None) -> LeaseLost:
        """The store refused ``held``'s renewal for ``refusal`` (None: a store gave none).

        >>> from ai_lease.lease import Fence, Refusal
        >>> print(LeaseLost.refused(Fence("job-1", "a", 11), Refusal.EXPIRED))  # doctest: +ELLIPSIS
        lease for job 'job-1' (token 11) lost: renewal refused (expired): the lease had expired...
        """
        text = "renewal refused"
        if refusal is not None:
            text += f" ({refusal.value}): {refusal.message}"
        return cls(held.key, text, held, refusal=refusal)


class FencingRejected(LeaseError):
    """A fenced write was refused because the caller's (token, owner) is not current.

    ``refusal`` says why (one of :data:`~ai_lease.refusal.WRITE_REFUSALS`); ``code``
    is its value, the label metrics and logs use.

    >>> from ai_lease.lease import Fence, Refusal
    >>> held, current = Fence("job-1", "a", 11), Fence("job-1", "b", 12)
    >>> print(FencingRejected("job-1", held, current, Refusal.NEWER_OWNER))  # doctest: +ELLIPSIS
    job 'job-1': fence token 11 of 'a' is stale, the store holds token 12 of 'b' (a newer...
    """

    def __init__(
        self, key: str, held: FenceLike, current: FenceLike | None, refusal: Refusal
    ) -> None:
        self.key, self.held, self.current, self.refusal = key, held, current, refusal
        self.code: str = refusal.value
        self.reason = refusal.message
        super().__init__(
            f"job {key!r}: fence {held} is stale, the store holds {current or 'none'} "
            f"({refusal.message}): result not written"
        )


class Stalled(LeaseError):
    """The job made no real progress within its stage's budget; its owner stepped back."""

    def __init__(self, key: str, stage: str | None, idle_s: float, budget_s: float) -> None:
        self.key, self.stage, self.idle_s, self.budget_s = key, stage, idle_s, budget_s
        super().__init__(
            f"job {key!r} stalled in stage {stage!r}: no progress for {idle_s:.2f}s "
            f"(budget {budget_s:g}s)"
        )


class JobConflict(AiLeaseError):
    """The key already names a job with a different payload; the stored one is untouched."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"job {key!r} already exists with a different payload: "
            "use a new key, or resubmit the same payload to get its result"
        )


class JobFailed(AiLeaseError):
    """The job ended FAILED: ``reason`` its last error, ``kind`` a FailureKind (None: unknown)."""

    def __init__(self, key: str, reason: str | None, kind: str | None = None) -> None:
        self.key, self.reason, self.kind = key, reason, kind
        super().__init__(f"job {key!r} failed: {reason or 'no reason recorded'}")


class JobCancelled(JobFailed):
    """The job was cancelled by key (``client.cancel(key)``, ``ai-lease cancel KEY``): it
    ends without a result, its owner is fenced out, and every follower gets this error.

    >>> print(JobCancelled("job-1", "cancelled by ops"))
    job 'job-1' was cancelled (cancelled by ops): no result; `ai-lease submit --force` runs it again
    """

    def __init__(self, key: str, reason: str | None) -> None:
        self.key, self.reason, self.kind = key, reason, None
        AiLeaseError.__init__(
            self,
            f"job {key!r} was cancelled ({reason or 'no reason given'}): no result; "
            "`ai-lease submit --force` runs it again",
        )


class StageTimeout(AiLeaseError):
    """A time budget ran out. ``budget_s`` is the budget that fired."""

    budget_s: float


class StageDeadlineExceeded(StageTimeout):
    def __init__(self, stage: str, budget_s: float) -> None:
        self.stage, self.budget_s = stage, budget_s
        super().__init__(f"stage {stage!r} ran past its hard deadline of {budget_s:g}s")


class JobDeadlineExceeded(StageTimeout):
    def __init__(self, key: str, budget_s: float) -> None:
        self.key, self.budget_s = key, budget_s
        super().__init__(f"job {key!r} ran past its total deadline of {budget_s:g}s")


class _StreamTimeout(StageTimeout):
    what = ""

    def __init__(self, budget_s: float, chunks: int = 0, text: str = "") -> None:
        self.budget_s, self.chunks, self.text = budget_s, chunks, text
        super().__init__(
            f"{self.what} (budget {budget_s:g}s; {chunks} content chunks, "
            f"{len(text)} characters received)"
        )


class FirstTokenTimeout(_StreamTimeout):
    what = (
        "the stream sent no text, reasoning or tool-call arguments before the first-token timeout"
    )


class StreamIdleTimeout(_StreamTimeout):
    what = "the stream went idle: no text, reasoning or tool-call arguments"


class StreamTotalTimeout(_StreamTimeout):
    what = "the stream ran past its total timeout"


class ProviderError(AiLeaseError):
    """A model call failed. ``retryable`` (429, 5xx, reset, timeout before content, garbage
    output) says whether another attempt may succeed; 400/401/403/404 and content filters
    are not retryable. ``status`` is the HTTP status when there was one; ``partial`` means
    content had already arrived (such a call is never silently resent)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        provider: str = "",
        status: int | None = None,
        retry_after: float | None = None,
        partial: bool = False,
    ) -> None:
        self.retryable, self.provider, self.status = retryable, provider, status
        self.retry_after, self.partial = retry_after, partial
        where = f"provider {provider!r}: " if provider else ""
        super().__init__(f"{where}{message}")


class StreamInterrupted(ProviderError):
    """The stream ended (``[DONE]`` or the body's end) before any finish reason: the server
    stopped this answer — llama.cpp's server does so to a running stream when another
    request arrives. What arrived is not a result; the call may be made again within the
    stage (see :func:`~ai_lease.retry.is_transient`)."""

    def __init__(self, how: str, *, provider: str = "", chunks: int = 0) -> None:
        self.chunks = chunks
        super().__init__(
            f"the stream was interrupted: {how} without a finish reason after {chunks} "
            "content chunks (what arrived is not an answer and was not kept)",
            retryable=True,
            provider=provider,
            partial=chunks > 0,
        )


class EmptyEventStream(ProviderError):
    """A 200 ``text/event-stream`` that ended without a single event. Not retried: the same
    request gets the same answer."""

    def __init__(self, *, provider: str = "") -> None:
        super().__init__(
            "the server answered 200 with no events — a prompt beyond the model's context "
            "does this on llama.cpp (shorten the input, or raise the server's context size)",
            retryable=False,
            provider=provider,
        )


class EmptyAnswer(ProviderError):
    """The call ended but the answer has no text and no tool call: never stored as a
    result unless the job says ``allow_empty``. Not retried: the same request with the
    same budget gets the same answer. The message says what happened and what to change."""

    def __init__(self, why: str, *, provider: str = "") -> None:
        super().__init__(why, retryable=False, provider=provider)


class RequestRefused(ProviderError):
    """A 500 or 501 whose body says the request itself is invalid (``request_fault``): not
    retryable as an attempt; :func:`~ai_lease.retry.call_with_retries` calls once more."""

    def __init__(self, message: str, *, provider: str, status: int) -> None:
        super().__init__(message, retryable=False, provider=provider, status=status)


class PoolTimeout(ProviderError):
    """Every connection of the provider's pool stayed busy for ``wait`` seconds: the process
    runs more streams at once than the provider's ``max_connections``. Not model latency
    (the first-token clock starts once a connection is held); retryable."""

    def __init__(self, wait: float, limit: int, *, provider: str = "") -> None:
        self.wait, self.limit = wait, limit
        super().__init__(
            f"no free connection within {wait:g} s (all {limit} in use): raise the "
            "provider's max_connections or run fewer streams at once",
            retryable=True,
            provider=provider,
        )


class StreamLimitExceeded(ProviderError):
    """One event or the whole answer outgrew its limit (``stream.max_event_bytes``,
    ``stream.max_answer_bytes``); the connection was closed. Not retried."""

    def __init__(self, limit: str, size: int, *, provider: str = "", chunks: int = 0) -> None:
        self.limit, self.size = limit, size
        super().__init__(
            f"the stream passed stream.{limit} ({size} bytes): the connection was closed "
            f"after {chunks} content chunks; raise stream.{limit} if such answers are expected",
            retryable=False,
            provider=provider,
            partial=chunks > 0,
        )


class StoreError(AiLeaseError):
    """The lease store could not give an answer."""


class StoreUnavailable(StoreError):
    """The store is unreachable or too slow; the operation's outcome may be unknown.
    ``where`` names the store with any password masked; ``maybe_applied``: the request may
    have reached it (a timeout, a lost reply), False only when it surely did not."""

    def __init__(self, where: str, op: str, detail: str, *, maybe_applied: bool = True) -> None:
        self.where, self.op, self.maybe_applied = where, op, maybe_applied
        super().__init__(f"lease store {where} unavailable during {op}: {detail}")


class OutcomeUnknown(StoreUnavailable):
    """A write reached (or may have reached) the store, but its answer was lost: it may have
    been applied. ``maybe_applied`` is always true; ``key`` names the job to check.

    >>> str(OutcomeUnknown("redis://r/0", "submit", "no answer", key="j"))  # doctest: +SKIP
    '... during submit: no answer; it may have been applied: check `ai-lease status j`'
    """

    def __init__(self, where: str, op: str, detail: str, *, key: str) -> None:
        self.key = key
        hint = f"it may have been applied: check `ai-lease status {key}`"
        super().__init__(where, op, f"{detail}; {hint}")


def _utc(at: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class StoreDataLost(StoreError):
    """The store lost its data: its epoch marker vanished or changed (a Redis restart
    without persistence). Jobs accepted, running or DONE before ``at`` may be gone; see
    docs/redis-durability.md. A value the store reports (``store.data_lost()``), not raised
    by operations."""

    def __init__(self, where: str, previous: str, current: str, *, at: float | None = None) -> None:
        self.where, self.previous, self.current, self.at = where, previous, current, at
        when = "" if at is None else f" at {_utc(at)}"
        super().__init__(
            f"lease store {where} lost its data{when} (epoch {previous} -> {current}): jobs "
            "recorded before then may be gone; run Redis with appendonly yes "
            "(docs/redis-durability.md)"
        )


class StoreMissing(StoreError):
    """A store opened only to look (``open_store(url, create=False)``) does not exist yet:
    nothing was created. ``where`` names it (password masked); the message says what creates it.

    >>> str(StoreMissing("sqlite:///x.db", "no store at /x.db; `ai-lease submit` creates it"))
    'no store at /x.db; `ai-lease submit` creates it'
    """

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        super().__init__(message)


class CorruptRecord(StoreError):
    """A value stored under a job's keys is not a job record this version understands
    (``kind``: what the key names, "job", "worker", "duration histogram")."""

    def __init__(self, key: str, detail: str, *, kind: str = "job") -> None:
        self.key, self.detail, self.kind = key, detail, kind
        super().__init__(
            f"{kind} {key!r}: stored value is not an ai_lease {kind} record ({detail}); "
            "it was left untouched"
        )


CorruptSink = Callable[[CorruptRecord], None]
"""Told about each corrupt entry a listing skipped (``on_corrupt=`` of the list calls)."""


def skip_corrupt(exc: CorruptRecord, on_corrupt: CorruptSink | None) -> None:
    """A listing met a corrupt entry: report it and go on, or raise it without a sink."""
    if on_corrupt is None:
        raise exc
    on_corrupt(exc)


class InputError(AiLeaseError):
    """Bad input from the user; nothing stored was changed."""


class ConfigError(InputError):
    """A setting is unknown or invalid; the message names the field and the rule."""


class JobSpecError(InputError):
    """A job file or job spec is malformed."""

    def __init__(self, message: str, **context: Any) -> None:
        self.context = context
        super().__init__(message)
