"""Who may look, and proof that a form came from our own page.

With a token configured every request (but ``/healthz``, ``/login`` and ``/static``) needs
``Authorization: Bearer TOKEN`` or the session cookie that ``POST /login`` sets. Without a
token (loopback only) anyone who reaches the port may look.

Every page visitor gets a session cookie (HttpOnly, SameSite=Strict): ``SID.KIND.SIG``,
where ``SIG`` is an HMAC under a per-process secret and ``KIND`` is ``auth`` (set by a
login with the token) or ``anon``. A form's CSRF token is the HMAC of the session id, so
a POST needs both the cookie and the token from a page we served (even with no token
configured: another site's page cannot make the browser act on ours).

Guessing is slowed per client (:class:`LoginThrottle`): after a few wrong tokens each further
try waits twice as long as the last, up to a minute, answered 429 without looking at the
token; off loopback the token itself must carry at least :data:`MIN_TOKEN_BITS` bits
(:func:`token_bits`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import string
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "COOKIE",
    "MIN_TOKEN_BITS",
    "OPEN_PATHS",
    "Guard",
    "LoginThrottle",
    "Session",
    "token_bits",
]

COOKIE = "ai_lease_session"
OPEN_PATHS = ("/healthz", "/login", "/static/")
MIN_TOKEN_BITS = 128
_CLASSES = (string.digits, string.ascii_lowercase, string.ascii_uppercase, string.punctuation)


def token_bits(token: str) -> float:
    """An upper estimate of a token's strength in bits: its length times log2 of the
    alphabet its character classes span, and no more than its distinct characters allow
    (a repeated character adds little).

    >>> round(token_bits("a")), token_bits(secrets.token_urlsafe(32)) >= MIN_TOKEN_BITS
    (5, True)
    >>> token_bits("x" * 64) < MIN_TOKEN_BITS
    True
    """
    alphabet = sum(len(chars) for chars in _CLASSES if any(c in chars for c in token))
    alphabet = max(alphabet, len(set(token)), 2)
    spread = len(set(token)) / max(len(token), 1)  # 1.0: no character repeats
    return len(token) * math.log2(alphabet) * min(1.0, 4 * spread)


@dataclass(frozen=True, slots=True)
class Session:
    """A verified session cookie: its id, and whether a login with the token made it."""

    sid: str
    authenticated: bool


class Guard:
    """Checks the token, signs and verifies session cookies, issues and checks CSRF tokens.

    >>> guard = Guard("s3cret")
    >>> guard.token_ok("s3cret"), guard.token_ok("guess")
    (True, False)
    """

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None
        self._secret = secrets.token_bytes(32)  # per process: a restart logs everyone out
        self.throttle = LoginThrottle()

    @property
    def required(self) -> bool:
        """Whether requests need the token."""
        return self._token is not None

    def __repr__(self) -> str:
        return f"Guard(required={self.required})"

    def token_ok(self, offered: str | None) -> bool:
        """Whether ``offered`` is the token (compared in constant time)."""
        if self._token is None or offered is None:
            return False
        return hmac.compare_digest(offered.encode(), self._token)

    def bearer_ok(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the token as a bearer."""
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(value.strip())

    def new_cookie(self, *, authenticated: bool) -> tuple[Session, str]:
        """A fresh session and its signed cookie value."""
        sid = secrets.token_urlsafe(18)
        kind = "auth" if authenticated else "anon"
        return Session(sid, authenticated), f"{sid}.{kind}.{self._sign('session', sid, kind)}"

    def session(self, cookie: str | None) -> Session | None:
        """The session a cookie value proves, or None (missing, forged, another process's)."""
        sid, kind, sig = [*(cookie or "").split("."), "", "", ""][:3]
        if not sid or kind not in ("auth", "anon"):
            return None
        if not hmac.compare_digest(sig, self._sign("session", sid, kind)):
            return None
        return Session(sid, kind == "auth")

    def csrf_token(self, session: Session) -> str:
        """The CSRF token forms of ``session`` carry."""
        return self._sign("csrf", session.sid)

    def csrf_ok(self, session: Session | None, offered: str | None) -> bool:
        """Whether ``offered`` is ``session``'s CSRF token."""
        if session is None or not offered:
            return False
        return hmac.compare_digest(offered, self.csrf_token(session))

    def _sign(self, purpose: str, *parts: str) -> str:
        message = "\x00".join((purpose, *parts)).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


class LoginThrottle:
    """Wrong tokens per client: the first :attr:`FREE` are answered at once; after that each
    client waits ``2 ** (n - FREE)`` seconds (at most :attr:`MAX_WAIT_S`) before its next try
    is even looked at. A right token clears the count. At most :attr:`MAX_CLIENTS` clients
    are remembered (the oldest forgotten first), so the table is bounded too.

    >>> clock = iter([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 2.0]).__next__
    >>> throttle = LoginThrottle(clock=clock)
    >>> for _ in range(5): throttle.failed("10.0.0.9")
    >>> throttle.wait_s("10.0.0.9"), throttle.wait_s("10.0.0.9") > 0, throttle.wait_s("10.0.0.9")
    (1.0, True, 0.0)
    """

    FREE = 4
    MAX_WAIT_S = 60.0
    MAX_CLIENTS = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._clients: OrderedDict[str, tuple[int, float]] = OrderedDict()  # (fails, until)

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must still wait before a try is checked (0: go ahead)."""
        fails, until = self._clients.get(client, (0, 0.0))
        return max(0.0, until - self._clock()) if fails else 0.0

    def failed(self, client: str) -> None:
        """Count a wrong token from ``client``."""
        fails = self._clients.pop(client, (0, 0.0))[0] + 1
        wait = 0.0 if fails <= self.FREE else min(2.0 ** (fails - self.FREE - 1), self.MAX_WAIT_S)
        self._clients[client] = (fails, self._clock() + wait)
        while len(self._clients) > self.MAX_CLIENTS:
            self._clients.popitem(last=False)

    def succeeded(self, client: str) -> None:
        """A right token: ``client`` starts afresh."""
        self._clients.pop(client, None)
