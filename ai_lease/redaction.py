"""One redactor for every text that leaves the process: errors, stored records, logs,
metrics, snapshots, ``ai-lease config``.

It masks two things: the **configured secret values themselves** (registered with
:func:`register_secret` by whoever reads them: the settings, :func:`create_provider`),
in any letter case and in the encodings an error body or a log line carries them in —
URL-quoted (partly or every byte ``%XX``), ``\\u``-escaped, base64 (standard or URL-safe, at
any offset inside a longer base64 text), either half of a long one, ``user:password@`` —
whatever their format; and well-known **shapes** (``sk-…``, ``Bearer …``, passwords in URLs,
``password=…``) for secrets nobody registered, in diagnostics. :func:`is_credential` says
which request header names carry a credential (masked when shown, sent to its own host only).

A model's answer is not a diagnostic: results are stored and shown exactly as the model
wrote them (a word that looks like a secret in an answer is the answer), never through here.

>>> register_secret("zz-4f1c9a7e-opaque")
>>> redact("401: key zz-4f1c9a7e-opaque rejected; Bearer abc.def")
'401: key *** rejected; Bearer ***'
"""

from __future__ import annotations

import base64
import re
import threading
from urllib.parse import quote, unquote, urlsplit

__all__ = [
    "SECRET_HEADERS",
    "is_credential",
    "mask_url",
    "redact",
    "register_secret",
    "register_url_secrets",
]

MASK = "***"
_MIN_SECRET_CHARS = 5  # shorter values would mask ordinary words; the shapes still apply
_MIN_HALF_CHARS = 8  # half of a secret is masked only when the half is this long itself
_NOT_A_VALUE = r"(?!(?:null|none|true|false)\b)"  # "api_key": null names no secret

_SHAPES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), "sk-***"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),
    # user:password@ in any URL; the password may itself hold "@" (greedy up to the last one)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*):\S*@"), r"\1:***@"),
    (re.compile(r"(?i)([?&](?:(?:ssl)?password|passwd|api_key|apikey|token)=)[^&#\s]*"), r"\1***"),
    (
        re.compile(
            r"(?i)\b(api[_-]?key|(?:ssl)?password|secret)([\"']?\s*[:=]\s*[\"']?)"
            + _NOT_A_VALUE
            + r"[^\s\"',&}\])]+"
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
    forms = {f for f in encodings(value) if len(f) >= _MIN_SECRET_CHARS}
    with _lock:
        if forms <= _secrets:
            return
        _secrets.update(forms)
        ordered = sorted(_secrets, key=len, reverse=True)  # longest first: no partial masks
        _pattern = re.compile("|".join(re.escape(s) for s in ordered), re.IGNORECASE)


def encodings(value: str) -> set[str]:
    """The texts ``value`` may appear as (matched in any letter case): itself, URL-quoted
    partly and every byte, ``\\u``-escaped, base64 at each of the three offsets, its halves.

    >>> "%68%75%6E%74%65%72%32%32" in encodings("hunter22"), "aHVudGVyMj" in encodings("hunter22")
    (True, True)
    """
    raw = value.encode()
    forms = {value, quote(value, safe=""), quote(value), unquote(value)}
    forms.add("".join(f"%{byte:02X}" for byte in raw))
    forms.add("".join(f"\\u{ord(char):04x}" for char in value if ord(char) < 0x10000))
    forms |= _base64_forms(raw)
    half = len(value) // 2
    if half >= _MIN_HALF_CHARS:  # a secret cut in two (a line wrap, a truncated message)
        forms |= {value[:half], value[half:]}
    return forms


def _base64_forms(raw: bytes) -> set[str]:
    """The base64 characters that depend on ``raw`` alone, for each offset (mod 3) it may
    start at inside a longer encoded text, standard and URL-safe alphabets."""
    forms = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw + b"\0\0").decode().rstrip("=")
        first = -(-8 * offset // 6)  # the first character made of the secret's bits only
        last = (8 * (offset + len(raw))) // 6  # one past the last such character
        stable = encoded[first:last]
        forms |= {stable, stable.replace("+", "-").replace("/", "_")}
    return forms


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


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs and errors).

    >>> mask_url("redis://:hunter2@cache:6379/0")
    'redis://:***@cache:6379/0'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # a libpq keyword string: host=h password=x (quoted values may hold spaces)
        return _PASSWORD_KEYWORD.sub(r"\1***", url)
    # The last "@" ends the user info: a password may itself hold "@", "/" or "?".
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{host}"
    return _PASSWORD_PARAM.sub(r"\1***", f"{scheme}{sep}{rest}")


_PASSWORD_PARAM = re.compile(r"(?i)([?&](?:ssl)?password=)[^&#]*")  # libpq's sslpassword too
_PASSWORD_KEYWORD = re.compile(r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie"}
)
"""Header names (lower-cased) whose value is a credential."""
# Any other name that looks like it carries one (X-Auth-Token, Ocp-Apim-Subscription-Key,
# x-litellm-api-key, Helicone-Auth …) is treated as one too: better masked than leaked.
_CREDENTIAL_WORDS = re.compile(r"auth|key|token|secret|cookie|session|passw|signature", re.I)


def is_credential(name: str) -> bool:
    """Whether header ``name`` carries a credential (by its name)."""
    return name.lower() in SECRET_HEADERS or _CREDENTIAL_WORDS.search(name) is not None
