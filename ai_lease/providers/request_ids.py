"""The ids a model call carries: a fresh UUID per request, and the job's correlation.

``X-Request-Id`` is by convention an opaque, unique id: gateways and servers validate or
overwrite it (llama-cpp-python's server answers 400 to anything but a UUID). Each model call
therefore sends a fresh UUID4 there (:func:`new_request_id`), and the job's correlation,
``<job key>:<fencing token>:<call number>`` (:func:`client_request_id`), goes where a
provider documents a client-supplied id: OpenAI's ``X-Client-Request-Id`` (ASCII, at most
512 characters), on the three OpenAI paths. Both are written in the job's timeline, one
``model_call`` entry per call, so a provider's log line can be found from
``ai-lease events KEY``.

>>> client_request_id("report é", 17, 2)
'report%20%C3%A9:17:2'
>>> len(new_request_id())
36
"""

from __future__ import annotations

import hashlib
import uuid
from urllib.parse import quote

__all__ = [
    "CLIENT_ID_HEADER",
    "CLIENT_ID_MAX",
    "REQUEST_ID_HEADER",
    "client_id_header",
    "client_request_id",
    "new_request_id",
]

REQUEST_ID_HEADER = "X-Request-Id"
CLIENT_ID_HEADER = "X-Client-Request-Id"
CLIENT_ID_MAX = 512
"""OpenAI's bound on ``X-Client-Request-Id``: ASCII, at most 512 characters."""

# Printable ASCII but '%' (the escape) and space (trimmed by HTTP): kept as they are.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
_KEY_MAX = 200  # characters of the encoded key kept whole in the correlation


def new_request_id() -> str:
    """A fresh UUID4, as ``X-Request-Id`` carries it: one per HTTP request."""
    return str(uuid.uuid4())


def client_request_id(key: str, token: int, n: int) -> str:
    """``<key>:<token>:<n>``, header-safe: the key's control, non-ASCII, space and ``%``
    characters percent-encoded (UTF-8); an encoded key over 200 characters is cut and
    followed by ``~`` and 16 hex digits of its SHA-256, so the value stays short and unique."""
    return f"{_encoded(key, _KEY_MAX)}:{token}:{n}"


def client_id_header(value: str) -> str:
    """``value`` as an ``X-Client-Request-Id`` may carry it: unchanged when it is printable
    ASCII of at most 512 characters, else encoded and cut as :func:`client_request_id` does
    (a caller's odd value never fails the call).

    >>> client_id_header("a\\r\\nb"), len(client_id_header("é" * 600)) <= 512
    ('a%0D%0Ab', True)
    """
    if len(value) <= CLIENT_ID_MAX and value.isascii() and value.isprintable():
        return value
    return _encoded(value, CLIENT_ID_MAX)


def _encoded(text: str, limit: int) -> str:
    safe = quote(text, safe=_HEADER_SAFE)
    if len(safe) <= limit:
        return safe
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    cut = safe[: limit - 20]
    cut = cut[: cut.rfind("%")] if "%" in cut[-2:] else cut  # never half an escape
    return f"{cut}~{digest}"
