"""Extra request headers a user sets per provider: checked, bounded, merged, never a leak.

``[provider] headers = {"X-Team" = "search"}`` (and ``[providers.<name>] headers``, and a
job file's ``[provider] headers``) are sent with every request of that provider, over the
headers the adapter sends by default; a header set to ``""`` is not sent at all (``"X-Client-
Request-Id" = ""`` drops the job's correlation id, ``"Authorization" = ""`` the key).

Bounds: at most :data:`MAX_HEADERS` headers; a name is an HTTP token of at most
:data:`MAX_NAME_CHARS` characters; a value at most :data:`MAX_VALUE_CHARS` characters of
printable ASCII (a tab allowed, never CR or LF). A header that carries a secret (its name
says so, :func:`~ai_lease.redaction.is_credential`, or its value holds a configured API key)
goes only to the host the settings configured for that provider (or one in
``provider.allowed_hosts``).

>>> with_extra({"Authorization": "Bearer k", "X-Id": "r"}, {"authorization": "", "X-A": "1"})
{'X-Id': 'r', 'X-A': '1'}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ai_lease.errors import ConfigError
from ai_lease.redaction import is_credential

__all__ = [
    "MAX_HEADERS",
    "MAX_NAME_CHARS",
    "MAX_VALUE_CHARS",
    "check_headers",
    "extra_headers",
    "masked_headers",
    "merge_headers",
    "secret_headers",
    "secret_values",
    "with_extra",
]

MAX_HEADERS = 64
MAX_NAME_CHARS = 256
MAX_VALUE_CHARS = 8192
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token
_VALUE = re.compile(r"[\t\x20-\x7e]*")
_MASK = "**********"  # as pydantic shows a SecretStr


def check_headers(headers: object, where: str = "") -> dict[str, str]:
    """``headers`` as a plain ``{name: value}``, or a ValueError naming ``where`` (a prefix
    such as ``"job file [provider] headers: "``) and what is wrong (never a value: it may be
    a credential)."""
    if not isinstance(headers, Mapping):
        raise ValueError(f"{where}must be a table of header names to texts")
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"{where}{len(headers)} headers; at most {MAX_HEADERS} are accepted")
    out: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in headers.items():
        _check_one(name, value, where)
        if name.lower() in seen:
            raise ValueError(f"{where}header {name!r} is given twice (names ignore case)")
        seen.add(name.lower())
        out[name] = value
    return out


def extra_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """An adapter's ``headers=`` option, checked: a :class:`ConfigError` naming what is wrong."""
    try:
        return check_headers(headers or {}, "provider.headers: ")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_one(name: Any, value: Any, where: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"{where}a header name must be 1 to {MAX_NAME_CHARS} characters")
    if not _TOKEN.fullmatch(name):
        raise ValueError(
            f"{where}{name[:80]!r} is not a valid header name "
            "(letters, digits and !#$%&'*+-.^_`|~ only)"
        )
    if not isinstance(value, str):
        raise ValueError(f'{where}header {name!r} must be a text ("" drops the header)')
    if len(value) > MAX_VALUE_CHARS:
        raise ValueError(
            f"{where}header {name!r} is {len(value)} characters; at most {MAX_VALUE_CHARS}"
        )
    if not _VALUE.fullmatch(value):
        bad = next(c for c in value if not _VALUE.fullmatch(c))
        raise ValueError(
            f"{where}header {name!r} holds U+{ord(bad):04X}: a value is printable ASCII "
            "(a tab allowed), never a line break"
        )


def merge_headers(*layers: Mapping[str, str]) -> dict[str, str]:
    """The layers merged, later ones winning, names compared ignoring case (the last
    spelling kept); a ``""`` value is kept: it drops the header when it is sent."""
    out: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            for old in [k for k in out if k.lower() == name.lower()]:
                del out[old]
            out[name] = value
    return out


def with_extra(headers: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with ``extra`` applied: each replaces a header of the same name (ignoring
    case); one set to ``""`` removes it."""
    if not extra:
        return dict(headers)
    drop = {name.lower() for name in extra}
    out = {k: v for k, v in headers.items() if k.lower() not in drop}
    out.update({k: v for k, v in extra.items() if v})
    return out


def secret_headers(headers: Mapping[str, str], keys: Iterable[str]) -> list[str]:
    """The names of ``headers`` that carry a credential: a ``SECRET_HEADERS`` name, or a
    value holding one of ``keys`` (the configured API keys)."""
    known = [k for k in keys if len(k) >= 5]
    return [
        name
        for name, value in headers.items()
        if value and (is_credential(name) or any(k in value for k in known))
    ]


def secret_values(headers: Mapping[str, str]) -> list[str]:
    """The values of ``headers`` that are credentials by their name, and each one's token
    after a scheme (``Bearer <token>``): what to register for redaction."""
    values = [v for k, v in headers.items() if v and is_credential(k)]
    return values + [v.split(None, 1)[1] for v in values if len(v.split(None, 1)) == 2]


def masked_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` as ``ai-lease config`` may show them: a credential's value masked."""
    return {k: _MASK if v and is_credential(k) else v for k, v in headers.items()}
