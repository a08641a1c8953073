"""Translating HTTP answers into :class:`ProviderError`: which are worth another try.

Retryable: 408, 409, 425, 429 (honouring ``Retry-After``), 5xx, connection failures and
garbage where JSON was promised. Not retryable: every other 4xx (400 bad request, 401 bad
key, 403, 404 unknown model…), and a content filter. The provider's own message is kept.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

import orjson

from ..errors import ProviderError

__all__ = ["parse_retry_after", "status_error"]

_RETRYABLE_4XX = frozenset({408, 409, 425, 429})


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return None if parsed is None else max(0.0, parsed.timestamp() - time.time())


def _message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return text[:200] or "(empty body)"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    if isinstance(error, str):
        return error[:500]
    return str(data)[:200]


def status_error(
    provider: str, status: int, body: bytes, headers: Mapping[str, str]
) -> ProviderError:
    """The error for a non-2xx answer."""
    retryable = status >= 500 or status in _RETRYABLE_4XX
    return ProviderError(
        f"HTTP {status}: {_message(body)}",
        retryable=retryable,
        provider=provider,
        status=status,
        retry_after=parse_retry_after(headers.get("retry-after")),
    )
