"""One default TLS context for every httpx client made in the test process.

Every ``httpx.AsyncClient`` (and every transport given to one) builds an
``ssl.SSLContext`` and loads certifi's CA bundle into it when it is made: 120-180 ms
of CPU each on this 2-core machine at load 7, though the tests speak plain HTTP to
127.0.0.1 and never use it. A helper that makes a client per request paid that per
request (test_admin's refused-token test: 663 requests, ~115 s of its ~115 s).

``share_default_tls_context()`` makes httpx build that default context once and hand
the same object to every client after (an ``SSLContext`` is made to be shared by
connections). Only the default (``verify=True``, no client certificate, the
environment trusted) is shared; any other ``verify``/``cert`` builds its own as
before. ``autom run`` children are untouched: this is the pytest process only.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import httpx._transports.default as _transports

_lock = threading.Lock()
_shared: ssl.SSLContext | None = None


def share_default_tls_context() -> None:
    """From now on, httpx clients of this process share one default TLS context."""
    build = _transports.create_ssl_context
    if getattr(build, "shares_default", False):
        return

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        global _shared
        if verify is not True or cert is not None or not trust_env:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        with _lock:
            if _shared is None:
                _shared = build()
            return _shared

    create_ssl_context.shares_default = True  # type: ignore[attr-defined]
    _transports.create_ssl_context = create_ssl_context  # type: ignore[assignment]
