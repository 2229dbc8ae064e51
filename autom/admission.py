"""Admission control: who may deliver to ``POST /hooks/{source}``, and when the answer is "not now".

``Admission`` holds the per-client tables the door applies before a body is read
(``TokenBuckets`` for CLIENT_RATE, ``FailingClients`` for repeated 401/404, the
header proof) and the refusals the intake applies after parsing (``backlog_refusal``:
503 at MAX_PENDING_JOBS; ``recipient_refusal``: 429 at MAX_PENDING_PER_RECIPIENT).
Invariants: no check counts rows per request (``Admission.run`` refreshes an estimate);
the tables are bounded (``MAX_CLIENTS``); every refusal is counted and logged once per
burst (``RefusalLog``). Who is refused when, and why: docs/design/intake.md.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from autom.db.queries import Q
from autom.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from autom.deps import Deps
    from autom.jobs.models import NewJob
    from autom.sources.base import Source

log = logging.getLogger("autom.admission")

#: More failed deliveries (401, 404) than this within ``FAIL_WINDOW`` seconds ...
FAIL_LIMIT = 20
FAIL_WINDOW = 10.0
#: ... and the client gets 429 for this long, before its body is read (README, Admission).
FAIL_BLOCK = 60.0
#: Longest the whole request body may take to arrive once the head is in.
BODY_DEADLINE_SECONDS = 10.0
#: How often the backlog estimate (and the warm recipients) are refreshed.
REFRESH_SECONDS = 1.0
#: Retry-After of a 503 for a full backlog: short, as senders that retry do so for days
#: and a long pause only lengthens the queue behind the outage.
BACKLOG_RETRY_AFTER = 30
#: Retry-After of a 429 for a recipient at its cap: well inside the 150 s a Telegram
#: callback query lives.
RECIPIENT_RETRY_AFTER = 30
#: Most client keys kept per table; beyond it the oldest go (a spoofed X-Forwarded-For
#: from a trusted proxy could otherwise grow the tables without bound).
MAX_CLIENTS = 100_000
#: Most warm recipients remembered from one refresh.
MAX_WARM = 10_000
#: A refusal burst (per reason and source) ends after this many quiet seconds.
BURST_QUIET_SECONDS = 10.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


# --- who the client is ------------------------------------------------------------------


def client_key(
    peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]
) -> str:
    """The client a request is counted against.

    The peer address, unless the peer is a trusted proxy: then X-Forwarded-For
    (all its values, in order) is walked from the right, past trusted proxies, and
    the first address that is not one is the client. If every listed address is
    trusted, the leftmost is. Something that is not an address ends the walk and is
    the client (cut to 64 characters): whoever put it there is not a proxy we trust.
    """
    if peer is None:
        return "unknown"
    if not trusted or not _trusted(peer, trusted):
        return peer
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop[:64]
    return hops[0][:64] if hops else peer


def _trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


# --- the per-client tables (pure: time passed in) ---------------------------------------


class TokenBuckets:
    """A token bucket per client key, kept as GCRA: one float per key (its theoretical arrival time).

    ``rate`` requests a second, bursts up to ``burst``. ``take(key, now)`` returns 0.0
    and spends a token, or the seconds until one is free (and spends nothing).
    """

    def __init__(self, rate: float, burst: float, max_keys: int = MAX_CLIENTS) -> None:
        """``rate`` per second, ``burst`` at most (at least 1)."""
        self.interval = 1.0 / rate
        self.tolerance = (max(1.0, burst) - 1.0) * self.interval
        self.max_keys = max_keys
        self._tat: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._tat)

    def take(self, key: str, now: float) -> float:
        """0.0 if ``key`` may go now (a token is spent), else how long until it may."""
        tat = max(self._tat.get(key, now), now)
        wait = tat - self.tolerance - now
        if wait > 1e-9:  # not 0: float sums of intervals land a hair off the exact time
            return wait
        self._tat[key] = tat + self.interval
        if len(self._tat) > self.max_keys:
            self.prune(now)
        return 0.0

    def prune(self, now: float) -> None:
        """Forget full buckets (their key behaves as new); past ``max_keys``, the oldest keys."""
        self._tat = {k: t for k, t in self._tat.items() if t > now}
        _drop_oldest(self._tat, self.max_keys)


class FailingClients:
    """Clients with more than ``limit`` failed deliveries in ``window`` seconds, blocked for ``block``."""

    def __init__(
        self, limit: int = FAIL_LIMIT, window: float = FAIL_WINDOW, block: float = FAIL_BLOCK,
        max_keys: int = MAX_CLIENTS,
    ) -> None:
        """The contract's numbers by default."""
        self.limit = limit
        self.window = window
        self.block = block
        self.max_keys = max_keys
        self._failures: dict[str, deque[float]] = {}
        self._blocked: dict[str, float] = {}

    def failed(self, key: str, now: float) -> bool:
        """Record a failed delivery of ``key`` at ``now``; True if this one blocks it."""
        times = self._failures.get(key)
        if times is None:
            times = self._failures[key] = deque(maxlen=self.limit + 1)
            if len(self._failures) > self.max_keys:
                self.prune(now)
        times.append(now)
        while times and times[0] <= now - self.window:
            times.popleft()
        if len(times) > self.limit:
            self._blocked[key] = now + self.block
            self._failures.pop(key, None)
            _drop_oldest(self._blocked, self.max_keys)
            return True
        return False

    def blocked_for(self, key: str, now: float) -> float:
        """Seconds ``key`` stays blocked (0.0: not blocked)."""
        until = self._blocked.get(key)
        if until is None:
            return 0.0
        if until <= now:
            del self._blocked[key]
            return 0.0
        return until - now

    def prune(self, now: float) -> None:
        """Forget failures older than the window and blocks that ended."""
        self._failures = {k: t for k, t in self._failures.items() if t and t[-1] > now - self.window}
        _drop_oldest(self._failures, self.max_keys)
        self._blocked = {k: u for k, u in self._blocked.items() if u > now}


def _drop_oldest(table: dict[str, Any], keep: int) -> None:
    """Keep at most ``keep`` entries, dropping the earliest inserted."""
    excess = len(table) - keep
    if excess > 0:
        for key in list(table)[:excess]:
            del table[key]


def retry_after(seconds: float) -> int:
    """Retry-After in whole seconds, at least 1 (an integer is what every sender parses)."""
    return max(1, math.ceil(seconds))


# --- logging refusals -------------------------------------------------------------------


class RefusalLog:
    """One log line when a burst of refusals (per reason and source) starts, one when it ends.

    A burst ends after ``quiet`` seconds without a refusal of its kind; its closing
    line says how many were refused and over how long. Pure: time passed in.
    """

    def __init__(self, logger: logging.Logger = log, quiet: float = BURST_QUIET_SECONDS) -> None:
        """Log to ``logger``; ``quiet`` seconds end a burst."""
        self._log = logger
        self.quiet = quiet
        self._bursts: dict[tuple[str, str], list[float]] = {}  # (reason, source) -> [first, last, count]

    def refused(self, reason: str, source: str, now: float, detail: str) -> None:
        """A delivery of ``source`` was refused for ``reason``."""
        burst = self._bursts.get((reason, source))
        if burst is not None:
            burst[1] = now
            burst[2] += 1
            return
        if len(self._bursts) < 1000:  # bounded by reasons x sources in practice
            self._bursts[(reason, source)] = [now, now, 1]
        self._log.warning("refusing %s deliveries (%s): %s", source, reason, detail,
                          extra={"source": source, "reason": reason})

    def flush(self, now: float) -> None:
        """Close the bursts that have been quiet long enough (one line each)."""
        for (reason, source), (first, last, count) in list(self._bursts.items()):
            if now - last >= self.quiet:
                del self._bursts[(reason, source)]
                self._log.warning(
                    "refusal burst over: %d %s deliveries refused (%s) in %.0f s", count, source, reason,
                    last - first, extra={"source": source, "reason": reason, "count": int(count)},
                )


# --- the backlog ------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """An answer the intake gives instead of storing: status, reason (metrics label), message, Retry-After."""

    status: int
    reason: str
    message: str
    retry_after: int


class Admission:
    """The admission state of one process: client tables, backlog estimate, warm recipients."""

    def __init__(self, deps: Deps, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Bound to ``deps`` (settings, sources, database, metrics)."""
        settings = deps.settings
        self.deps = deps
        self.sources: Mapping[str, Source] = deps.sources
        self.max_body = settings.max_body_bytes
        self.trusted = settings.trusted_networks()
        self.buckets = TokenBuckets(settings.client_rate, 2 * settings.client_rate)
        self.failing = FailingClients()
        self.refusals = RefusalLog()
        self.clock = clock
        self.max_pending = settings.max_pending_jobs
        self.recipient_cap = settings.max_pending_per_recipient
        self.warm_floor = max(1, self.recipient_cap // 2)
        #: unfinished jobs at the last refresh plus those this process stored since
        self.backlog = 0
        self._warm: dict[str, int] = {}
        self._fed: dict[str, int] = {}  # jobs this process stored per recipient since the refresh
        self._db_down_logged = False
        deps.metrics.backlog.set_function(lambda: self.backlog)

    # -- the door's side -----------------------------------------------------------

    def refuse(self, reason: str, source: str, detail: str) -> None:
        """Count and log (once per burst) one refusal."""
        self.deps.metrics.refusals.labels(reason, source).inc()
        self.refusals.refused(reason, source, self.clock(), detail)

    # -- the intake's side ---------------------------------------------------------

    def backlog_refusal(self, source: Source) -> Refusal | None:
        """503 when the backlog is full for ``source``'s sender (README, Admission), else None."""
        if self.backlog >= 2 * self.max_pending:
            return Refusal(503, "backlog", "the queue is full, try again later", BACKLOG_RETRY_AFTER)
        if self.backlog >= self.max_pending and getattr(source, "sender_retries", False):
            return Refusal(503, "backlog", "the queue is busy, try again later", BACKLOG_RETRY_AFTER)
        return None

    async def recipient_refusal(self, jobs: Iterable[NewJob], deadline: float = math.inf) -> Refusal | None:
        """429 when a recipient of ``jobs`` has MAX_PENDING_PER_RECIPIENT unfinished jobs, else None.

        Only warm recipients cost a query (module docstring); raises
        ``DatabaseUnavailable`` like any query, and when one takes past ``deadline``
        (trio time: the delivery's, autom/web/intake.py).
        """
        for recipient in {job.recipient for job in jobs if job.recipient is not None}:
            if self._warm.get(recipient, 0) + self._fed.get(recipient, 0) < self.warm_floor:
                continue
            with trio.move_on_at(deadline) as counting:
                count = await self.deps.db.fetch_val(
                    Q.admission_recipient_unfinished, {"recipient": recipient, "cap": self.recipient_cap},
                    prepare=True,
                )
            if counting.cancelled_caught:
                raise DatabaseUnavailable("the admission checks took past the delivery's deadline")
            if int(count or 0) >= self.recipient_cap:
                return Refusal(429, "recipient", "too many unfinished jobs for this recipient, try again later",
                               RECIPIENT_RETRY_AFTER)
        return None

    def stored(self, jobs: Sequence[NewJob], created: int) -> None:
        """The intake stored ``created`` of ``jobs``: count them until the next refresh."""
        if not created:
            return
        self.backlog += created
        if len(self._fed) < MAX_WARM:
            for job in jobs:
                if job.recipient is not None:
                    self._fed[job.recipient] = self._fed.get(job.recipient, 0) + 1

    # -- the background refresh ----------------------------------------------------

    async def refresh(self) -> None:
        """Count unfinished jobs (bounded at twice the cap) and, if needed, list the warm recipients."""
        db = self.deps.db
        total = await db.fetch_val(Q.admission_backlog, {"limit": 2 * self.max_pending + 1}, prepare=True)
        warm: dict[str, int] = {}
        if int(total or 0) >= self.warm_floor:
            rows = await db.fetch_all(Q.admission_warm_recipients, {"floor": self.warm_floor, "limit": MAX_WARM})
            warm = {row["recipient"]: int(row["n"]) for row in rows}
        self.backlog = int(total or 0)
        self._warm = warm
        self._fed = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh the estimate, prune the tables and close quiet refusal bursts, forever."""
        task_status.started()
        while True:
            started = trio.current_time()
            try:
                await self.refresh()
                if self._db_down_logged:
                    log.info("backlog estimate refreshed again: %d unfinished jobs", self.backlog)
                self._db_down_logged = False
            except Exception as exc:  # the database is away: keep the last estimate
                if not self._db_down_logged:
                    log.warning("cannot refresh the backlog estimate, keeping %d: %s", self.backlog, exc)
                    self._db_down_logged = True
            now = self.clock()
            self.buckets.prune(now)
            self.failing.prune(now)
            self.refusals.flush(now)
            # a count that takes long on a huge backlog is not repeated back to back
            elapsed = trio.current_time() - started
            await trio.sleep(max(REFRESH_SECONDS, 5 * elapsed))
