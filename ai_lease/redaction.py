"""One redactor for every text that leaves the process: errors, stored records, logs,
metrics, snapshots, ``ai-lease config``.

It masks two things: the **configured secret values themselves** (registered with
:func:`register_secret` by whoever reads them: the settings, :func:`create_provider`),
in their plain, URL-quoted and ``user:password@`` forms, whatever their format; and
well-known **shapes** (``sk-…``, ``Bearer …``, passwords in URLs, ``password=…``) for
secrets nobody registered.

>>> register_secret("zz-4f1c9a7e-opaque")
>>> redact("401: key zz-4f1c9a7e-opaque rejected; Bearer abc.def")
'401: key *** rejected; Bearer ***'
"""

from __future__ import annotations

import re
import threading
from urllib.parse import quote, unquote, urlsplit

__all__ = ["redact", "register_secret", "register_url_secrets"]

MASK = "***"
_MIN_SECRET_CHARS = 5  # shorter values would mask ordinary words; the shapes still apply

_SHAPES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), "sk-***"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),
    # user:password@ in any URL; the password may itself hold "@" (greedy up to the last one)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*):\S*@"), r"\1:***@"),
    (re.compile(r"(?i)([?&](?:(?:ssl)?password|passwd|api_key|apikey|token)=)[^&#\s]*"), r"\1***"),
    (
        re.compile(
            r"(?i)\b(api[_-]?key|(?:ssl)?password|secret)([\"']?\s*[:=]\s*[\"']?)[^\s\"',&]+"
        ),
        r"\1\2***",
    ),
]

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def register_secret(value: str | None) -> None:
    """Mask ``value`` (and its URL-quoted forms) in every text :func:`redact` sees."""
    global _pattern
    if value is None or len(value) < _MIN_SECRET_CHARS:
        return
    forms = {value, quote(value, safe=""), quote(value), unquote(value)}
    forms = {f for f in forms if len(f) >= _MIN_SECRET_CHARS}
    with _lock:
        if forms <= _secrets:
            return
        _secrets.update(forms)
        ordered = sorted(_secrets, key=len, reverse=True)  # longest first: no partial masks
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def register_url_secrets(url: str | None) -> None:
    """Register the password (and ``user:password``) a URL carries, if any."""
    if not url or "@" not in url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if parts.password:
        register_secret(parts.password)
        register_secret(f"{parts.username or ''}:{parts.password}")


def redact(text: str) -> str:
    """``text`` without secrets: registered values, API keys, bearer tokens, URL passwords.

    >>> redact("401 from https://bob:hunter2@api.example/v1 with key sk-abc123def456")
    '401 from https://bob:***@api.example/v1 with key sk-***'
    """
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for shape, replacement in _SHAPES:
        text = shape.sub(replacement, text)
    return text
