"""The console's session cookie, CSRF token and notice seals: pure, with the time passed in.

``Sessions(ADMIN_TOKEN, lifetime)`` issues and checks ``v1.<issued>.<nonce>.<mac>``
cookies (valid for the lifetime, never renewed by use; changing ADMIN_TOKEN ends every
session), derives each session's CSRF token and seals the notices a redirect carries.
``cross_site`` reads Sec-Fetch-Site / Origin. Invariants: the token itself is never in
a cookie, a URL or a log; every comparison is constant-time. Why each choice:
docs/design/console.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from autom.web.token import AdminToken

COOKIE = "autom_console"
_VERSION = "v1"
#: the clock skew between replicas a session's times allow for
SKEW_SECONDS = 60


def _key(token: str, purpose: str) -> bytes:
    """A key for ``purpose`` derived from ADMIN_TOKEN (the token itself signs nothing)."""
    return hmac.new(token.encode("utf-8"), f"autom console {purpose} {_VERSION}".encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Session:
    """A valid session: when it was issued and its nonce (the CSRF token derives from it)."""

    issued: int
    nonce: str


class Sessions:
    """Issues and checks session cookies and CSRF tokens for one ADMIN_TOKEN."""

    def __init__(self, admin_token: str, lifetime_seconds: float) -> None:
        self._session_key = _key(admin_token, "session")
        self._csrf_key = _key(admin_token, "csrf")
        self._notice_key = _key(admin_token, "notice")
        self._token = AdminToken(admin_token)
        self.lifetime = lifetime_seconds

    def token_matches(self, candidate: str) -> bool:
        """Whether ``candidate`` is ADMIN_TOKEN (constant time, whatever its length)."""
        return self._token.matches(candidate)

    def issue(self, now: float) -> str:
        """A new session cookie value, issued at ``now`` (unix seconds)."""
        payload = f"{_VERSION}.{int(now)}.{secrets.token_urlsafe(18)}"
        return f"{payload}.{self._mac(payload)}"

    def check(self, value: str | None, now: float) -> Session | None:
        """The session of cookie ``value`` if it is authentic and not expired at ``now``, else None."""
        if not value or len(value) > 200:
            return None
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
            return None
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(self._mac(payload).encode(), _utf8(parts[3])):
            return None
        issued = int(parts[1])
        if not issued - SKEW_SECONDS <= now < issued + self.lifetime:
            return None
        return Session(issued=issued, nonce=parts[2])

    def seal(self, session: Session, text: str) -> str:
        """A seal of ``text`` for ``session``: what a redirect after an action tells its page (``unsealed``)."""
        return hmac.new(self._notice_key, f"{session.nonce} {text}".encode(), hashlib.sha256).hexdigest()[:32]

    def unsealed(self, session: Session, text: str, seal: str | None) -> bool:
        """Whether ``seal`` is ``session``'s seal of ``text`` (a crafted or another session's link is not)."""
        return bool(seal) and hmac.compare_digest(self.seal(session, text).encode(), _utf8(str(seal)))

    def csrf_token(self, session: Session) -> str:
        """The CSRF token of ``session`` (the same for all its forms and tabs)."""
        return hmac.new(self._csrf_key, session.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: Session, candidate: str | None) -> bool:
        """Whether ``candidate`` is the CSRF token of ``session`` (constant time)."""
        return bool(candidate) and hmac.compare_digest(self.csrf_token(session).encode(), _utf8(str(candidate)))

    def _mac(self, payload: str) -> str:
        return hmac.new(self._session_key, payload.encode(), hashlib.sha256).hexdigest()


def _utf8(text: str) -> bytes:
    """``text`` as bytes to compare in constant time (``compare_digest`` refuses non-ASCII strings)."""
    return text.encode("utf-8", "surrogatepass")


def cross_site(sec_fetch_site: str | None, origin: str | None, host: str | None) -> bool:
    """Whether a POST came from another site, by what the browser says.

    ``Sec-Fetch-Site`` (sent by current browsers over https and to localhost) must be
    ``same-origin`` (or ``none``: typed by the user). Without it, an ``Origin`` header
    must name this host (scheme aside: a proxy may end TLS). Neither header (old
    clients, curl) passes here: the CSRF token still has to be right.
    """
    if sec_fetch_site is not None:
        return sec_fetch_site.strip().lower() not in ("same-origin", "none")
    if origin is not None:
        if origin.strip() == "null" or host is None:
            return True
        return urlsplit(origin.strip()).netloc.lower() != host.strip().lower()
    return False
