"""ADMIN_TOKEN compared in constant time: the admin API's bearer token and the console's login.

``AdminToken(token).matches(candidate)``: both sides are hashed first, so that
``compare_digest`` (constant-time only for inputs of one length) cannot let timing
reveal the token's length. Without a token nothing matches, not even an empty candidate.
"""

from __future__ import annotations

import hashlib
import hmac


class AdminToken:
    """The ADMIN_TOKEN setting as a digest; ``None`` or ``""`` disables it (nothing matches)."""

    def __init__(self, token: str | None) -> None:
        """Keep the digest of ``token`` (UTF-8), never the token itself."""
        self._digest = hashlib.sha256(token.encode("utf-8")).digest() if token else None

    @property
    def enabled(self) -> bool:
        """Whether a token is set at all (without one the admin API and the console refuse everyone)."""
        return self._digest is not None

    def matches(self, candidate: bytes | str) -> bool:
        """Whether ``candidate`` (raw header bytes, or text: UTF-8, lone surrogates kept) is the token."""
        if self._digest is None:
            return False
        raw = candidate if isinstance(candidate, bytes) else candidate.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(hashlib.sha256(raw).digest(), self._digest)
