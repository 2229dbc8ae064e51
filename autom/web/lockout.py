"""A wrong ADMIN_TOKEN counts against its client, as a webhook's failed verification does.

A refused ``/admin`` request (401) and a wrong console login each count as a failed
delivery of their client, in the same per-client table the door keeps for
``/hooks`` (``autom.admission.FailingClients``): more than 20 within 10 s and the
client gets 429 for 60 s, whatever token it sends then. Only that client: the
right token still works from every other one (there is no global cap anyone
could fill). The client is the peer address, or behind TRUSTED_PROXIES the one
X-Forwarded-For names (``client_key``). Refusals are logged at most once a second
per client (``LogThrottle``), so guessing cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from quart import current_app, request

from autom.admission import MAX_CLIENTS, FailingClients, client_key
from autom.deps import Deps
from autom.ops import visible

#: at most one log line per client in this many seconds
LOG_EVERY_SECONDS = 1.0


class LogThrottle:
    """Whether a line about ``key`` may be logged now: at most one per ``every`` seconds (pure)."""

    def __init__(self, every: float = LOG_EVERY_SECONDS, max_keys: int = MAX_CLIENTS) -> None:
        """``every`` seconds between two lines of one key; at most ``max_keys`` keys remembered."""
        self.every = every
        self.max_keys = max_keys
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def allow(self, key: str, now: float) -> int | None:
        """None if not now; else how many lines of ``key`` were skipped since its last one."""
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return None
        if last is None and len(self._last) >= self.max_keys:  # a new key: forget those gone quiet
            self._last = {k: t for k, t in self._last.items() if now - t < self.every}
            self._skipped = {k: n for k, n in self._skipped.items() if k in self._last}
        self._last[key] = now
        return self._skipped.pop(key, 0)


class Lockout:
    """The failed-token lockout of ``/admin`` and the console's login, for one ``Deps``."""

    def __init__(self, deps: Deps, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        """Clients as TRUSTED_PROXIES says; log to ``logger``; ``clock`` when no admission table is shared."""
        self._trusted = deps.settings.trusted_networks()
        self._log = logger
        self._own = FailingClients()
        self._clock = clock
        self._throttle = LogThrottle()

    def _table(self) -> tuple[FailingClients, Callable[[], float]]:
        """The door's table of failing clients (create_app puts its ``Admission`` on the app), else our own."""
        admission = current_app.extensions.get("autom.admission")
        if admission is None:
            return self._own, self._clock
        return admission.failing, admission.clock

    def client(self) -> str:
        """The client of the current request (the door's rule: the peer, or whom a trusted proxy names)."""
        forwarded = request.headers.getlist("X-Forwarded-For") if self._trusted else []
        return client_key(request.remote_addr, forwarded, self._trusted)

    def blocked_for(self, client: str) -> float:
        """Seconds ``client`` stays refused for failing (0.0: it may try)."""
        table, clock = self._table()
        return table.blocked_for(client, clock())

    def failed(self, client: str, what: str) -> None:
        """Count a wrong token of ``client``; log ``what`` happened (at most a line a second per client)."""
        table, clock = self._table()
        now = clock()
        blocked = table.failed(client, now)
        self.note(client, f"{what}{'; it is refused for a while now' if blocked else ''}", now)

    def note(self, client: str, what: str, now: float | None = None) -> None:
        """Log ``what`` about ``client`` unless a line about it was logged within the last second."""
        skipped = self._throttle.allow(client, self._table()[1]() if now is None else now)
        if skipped is not None:
            more = f" ({skipped} more not logged)" if skipped else ""
            shown = visible(client, one_line=True)  # a name a trusted proxy passed on, not always an address
            self._log.warning("%s from %s%s", what, shown, more, extra={"remote": shown})
