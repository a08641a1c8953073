"""Who may look, and proof that a form came from our own page.

With a token configured every request (but ``/healthz``, ``/login`` and ``/static``) needs
``Authorization: Bearer TOKEN`` or the session cookie that ``POST /login`` sets. Without a
token (loopback only) anyone who reaches the port may look.

Every page visitor gets a session cookie (HttpOnly, SameSite=Strict): ``SID.KIND.SIG``,
where ``SIG`` is an HMAC under a per-process secret and ``KIND`` is ``auth`` (set by a
login with the token) or ``anon``. A form's CSRF token is the HMAC of the session id, so
a POST needs both the cookie and the token from a page we served (even with no token
configured: another site's page cannot make the browser act on ours).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

__all__ = ["COOKIE", "OPEN_PATHS", "Guard", "Session"]

COOKIE = "ai_lease_session"
OPEN_PATHS = ("/healthz", "/login", "/static/")


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
