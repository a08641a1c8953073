"""Translating HTTP answers into :class:`ProviderError`: which are worth another try.

Retryable: 408, 409, 425, 429, 5xx, connection failures and garbage where JSON was
promised. Not retryable: every other 4xx (400 bad request, 401 bad key, 403, 404 unknown
model…), and a content filter.

A retryable answer carries the provider's own retry hint, when it gives one
(:func:`retry_hint`, bounded to 0..:data:`MAX_RETRY_AFTER_S`; a value it cannot read is
ignored): OpenAI's ``retry-after-ms``, ``Retry-After`` (seconds or an HTTP date), Google's
``RetryInfo.retryDelay`` in the error body (``"4s"``), and on a 429 without those OpenAI's
``x-ratelimit-reset-requests`` / ``-tokens`` (``"1s"``, ``"6m0s"``) of the exhausted limit.
The call's retry waits at least that long, or is not made when the wait would pass the
stage's deadline (:func:`~ai_lease.retry.call_with_retries`).

One kind of 5xx is the request's fault, not the server's: llama.cpp's servers answer 500 to
a ``json_schema`` or grammar they cannot compile, or a ``response_format`` they do not
support (``{"error": {"code": 500, "message": "...", "type": "server_error"}}``;
llama-cpp-python's ``internal_server_error``). A 500 or 501 whose JSON error message says so
(:func:`request_fault`: it names a JSON schema, a grammar, ``response_format`` or
``tool_choice``, or says "invalid request/argument/schema…", "failed to parse", "not
supported") is :class:`~ai_lease.errors.RequestRefused`: called once more within the stage
(a server's real hiccup gets its second chance), never by another attempt. Any other 5xx
is retried as before. The provider's own message is kept; an answer with an empty body
says instead what was sent that a server may refuse (:func:`describe_sent`: the method,
the body's size, the header names, never a value).
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping

import orjson

from ai_lease.errors import ProviderError, RequestRefused

__all__ = [
    "MAX_RETRY_AFTER_S",
    "RequestRefused",
    "describe_sent",
    "empty_answer",
    "error_message",
    "go_duration",
    "parse_retry_after",
    "request_fault",
    "retry_hint",
    "status_error",
]

_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
MAX_RETRY_AFTER_S = 60.0
"""The longest wait a ``Retry-After`` can ask for; the stage deadline may cut it further."""


_FAULT_STATUS = frozenset({500, 501})
_REQUEST_FAULT = re.compile(  # a request llama.cpp (C++ or Python) could not take
    r"(?i)json[ _-]?schema|grammar|response_format|tool[ _]choice|must be one of"
    r"|invalid (?:request|argument|parameter|schema|json|value|quantifier)"
    r"|failed to parse|error parsing|unrecognized schema|unsupported ref|not supported"
)


def request_fault(status: int, message: str | None) -> bool:
    """Whether a ``status`` answer whose JSON error ``message`` is the server's own words
    says the request is at fault (a 500 or 501 only; None: no such message).

    >>> request_fault(500, "failed to parse grammar"), request_fault(503, "invalid schema")
    (True, False)
    >>> request_fault(500, "CUDA out of memory")
    False
    """
    if status not in _FAULT_STATUS or not message:
        return False
    return _REQUEST_FAULT.search(message) is not None


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), within
    0..:data:`MAX_RETRY_AFTER_S`; None (the policy's own backoff) for anything else.

    >>> parse_retry_after("soon") is None, parse_retry_after("inf"), parse_retry_after("-5")
    (True, 60.0, 0.0)
    """
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return _bounded(seconds)


def _bounded(seconds: float | None) -> float | None:
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def retry_hint(status: int, headers: Mapping[str, str], data: object = None) -> float | None:
    """Seconds the provider asks to be left alone before another try (the module's
    docstring), from an answer's ``headers`` and its parsed JSON body ``data``; None when it
    asks nothing it can be read for.

    >>> retry_hint(429, {"retry-after-ms": "1500"}), retry_hint(503, {"retry-after": "2"})
    (1.5, 2.0)
    >>> delay = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "4s"}
    >>> retry_hint(429, {}, {"error": {"code": 429, "details": [delay]}})
    4.0
    >>> retry_hint(429, {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"})
    60.0
    """
    seconds = _number(headers.get("retry-after-ms"), 0.001)
    if seconds is None and (after := parse_retry_after(headers.get("retry-after"))) is not None:
        return after
    if seconds is None:
        seconds = retry_delay(data)
    if seconds is None and status == 429:
        seconds = rate_limit_reset(headers)
    return _bounded(seconds)


def _number(value: str | None, unit: float) -> float | None:
    try:
        return float(value) * unit if value else None
    except ValueError:
        return None


_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)s\s*")


def retry_delay(data: object) -> float | None:
    """Google's ``RetryInfo.retryDelay`` (a JSON ``Duration``, ``"4s"`` / ``"0.86s"``) in
    an error body's ``error.details`` (``data``: the body, or its ``error`` object; the body
    may be wrapped in a list, as Gemini's OpenAI-compatible endpoint sends it)."""
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error", data) if isinstance(data, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and detail.get("@type") == _RETRY_INFO:
            delay = detail.get("retryDelay")
            match = _DURATION.fullmatch(delay) if isinstance(delay, str) else None
            return float(match.group(1)) if match else None
    return None


_RESET = re.compile(r"(\d+(?:\.\d*)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def rate_limit_reset(headers: Mapping[str, str]) -> float | None:
    """OpenAI's ``x-ratelimit-reset-requests`` / ``-tokens`` (``"1s"``, ``"6m0s"``,
    ``"20ms"``): of the limits whose ``x-ratelimit-remaining-*`` is 0, else of all given,
    the longest."""
    resets = {
        kind: go_duration(headers.get(f"x-ratelimit-reset-{kind}"))
        for kind in ("requests", "tokens")
    }
    known = {kind: s for kind, s in resets.items() if s is not None}
    spent = [s for kind, s in known.items() if headers.get(f"x-ratelimit-remaining-{kind}") == "0"]
    return max(spent or known.values(), default=None)


def go_duration(value: str | None) -> float | None:
    """Seconds of a duration as OpenAI writes it (``"1h2m3.5s"``); None for anything else."""
    text = (value or "").strip()
    if not text or _RESET.sub("", text):
        return None
    return sum(float(n) * _UNIT_S[unit] for n, unit in _RESET.findall(text))


def describe_sent(method: str, headers: Iterable[str], body: bytes | None) -> str:
    """What a request carried, for an error whose answer says nothing: the method, the
    body's size and the header names (sorted, never a value: one may hold a key).

    >>> describe_sent("POST", ["X-Request-Id", "Authorization"], b"{}")
    'POST with a 2-byte body and headers Authorization, X-Request-Id'
    """
    names = ", ".join(sorted(headers, key=str.lower)) or "none"
    size = f"a {len(body)}-byte body" if body else "no body"
    return f"{method} with {size} and headers {names}"


def empty_answer(sent: str) -> str:
    """The message of an error answer with an empty body: what was sent, for a server that
    refused something without saying what (``sent`` from :func:`describe_sent`)."""
    return (
        f"an empty body: the server said nothing of why. The request was {sent}; "
        "a server may refuse one of those (a header, the body's size)"
    )


def _message(body: bytes, sent: Callable[[], str] | None = None) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        if text:
            return text[:200]
        return "(empty body)" if sent is None else empty_answer(sent())
    return error_message(data) or str(data)[:200]


def error_message(data: object) -> str | None:
    """The ``error.message`` (or ``error`` text) of a JSON error answer, at most 500
    characters; None when it has neither."""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    if isinstance(error, str) and error:
        return error[:500]
    return None


def _parsed(body: bytes) -> object:
    """The JSON of an error answer's body; None when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def status_error(
    provider: str,
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    sent: Callable[[], str] | None = None,
) -> ProviderError:
    """The error for a non-2xx answer; ``sent`` describes the request (for an empty body)."""
    message = f"HTTP {status}: {_message(body, sent)}"
    data = _parsed(body)
    if status in _FAULT_STATUS and request_fault(status, error_message(data)):
        return RequestRefused(message, provider=provider, status=status)
    retryable = status >= 500 or status in _RETRYABLE_4XX
    return ProviderError(
        message,
        retryable=retryable,
        provider=provider,
        status=status,
        retry_after=retry_hint(status, headers, data),
    )
