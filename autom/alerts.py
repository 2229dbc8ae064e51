"""The alert outbox's sender: job failures reach the alert chat even across a kill.

A job that fails for good gets an ``alerts`` row in the statement that fails it.
``AlertSender`` (one per replica, in the service nursery) claims pending rows with a
lease, sends them to the alert chat (``autom.telegram``) and marks them sent only once
Telegram accepted them; ``AlertThrottle`` and the alert chat's turn hold the rest for
one summary (``summary_text``); ``read_alert_health`` feeds /health and /metrics.
Invariants: at least once (a kill between Telegram's answer and the mark repeats one
alert), never twice from two replicas while a lease holds; ``alert`` never raises.
How and why: docs/design/alerts.md.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from autom.checks import one_line
from autom.db.queries import Q
from autom.deps import Deps

if TYPE_CHECKING:
    from autom.db.bridge import Database
    from autom.telegram import AlertResult

log = logging.getLogger("autom.alerts")

#: how often a sender looks for alerts nobody rang it about
POLL_SECONDS = 2.0
#: an alert not rung by this process is taken once this old (its own process had the
#: first chance; after this it is presumed gone)
ORPHAN_SECONDS = 3.0
#: most alerts claimed in one look
CLAIM_LIMIT = 200
#: backoff after failed deliveries: 0.5 s, 1 s, 2 s, ... up to this
MAX_BACKOFF_SECONDS = 60.0
#: longest wait a 429 on the alert chat may impose
MAX_RETRY_AFTER_SECONDS = 300.0
#: an unsent alert older than this makes /health say "degraded" (past the throttle's
#: minute and a few backoff rounds, it is not on its way: something refuses it)
STALE_SECONDS = 300.0
#: an unsent alert older than this is held back (by the alert chat's limit, the throttle
#: or an outage): /health says "degraded" until it is sent, alone or in a summary
HELD_SECONDS = 15.0
#: a summary names job ids up to about this many characters (Telegram takes 4,096)
SUMMARY_CHARS = 3500
#: at shutdown, how many turns of the alert chat ``flush`` waits for its held alerts
#: (within the service's bound on the flush)
FINAL_TURNS = 2
#: where the console lists the failed jobs (README, Console)
FAILED_LIST = "/ui/jobs?status=failed"

Row = dict[str, Any]


@dataclass(frozen=True)
class AlertHealth:
    """Whether alerts get out, as every replica can read it from the database."""

    #: alerts not delivered yet
    unsent: int
    #: of those, how many have waited longer than ``STALE_SECONDS``
    stale: int
    #: why the last delivery anyone tried failed; empty when it succeeded (or none was tried)
    failing: str = ""
    #: of the unsent, how many have waited longer than ``HELD_SECONDS`` (but not ``STALE_SECONDS``)
    held: int = 0

    @property
    def problems(self) -> list[str]:
        """One line per reason alerts are not getting through (empty: they are)."""
        found = []
        if self.failing:
            found.append(f"the last alert could not be delivered: {self.failing}")
        if self.stale:
            found.append(f"{self.stale} alert(s) unsent for over {STALE_SECONDS / 60:g} minutes")
        if self.held:
            found.append(f"{self.held} alert(s) held back for over {HELD_SECONDS:g} s (the alert chat's limit or "
                         f"the throttle): a summary will name them, the console lists them ({FAILED_LIST})")
        return found


async def read_alert_health(db: Database) -> AlertHealth:
    """The outbox's state and the last delivery's outcome (one small query)."""
    row = await db.fetch_one(Q.alerts_health, {"stale": STALE_SECONDS, "held": HELD_SECONDS})
    delivery = (row or {}).get("delivery") or {}
    failing = "" if delivery.get("ok", True) else str(delivery.get("error") or "refused")
    return AlertHealth(unsent=int((row or {}).get("unsent") or 0), stale=int((row or {}).get("stale") or 0),
                       failing=failing, held=int((row or {}).get("held") or 0))


async def note_delivery(db: Database, result: AlertResult) -> None:
    """Record the outcome of an alert delivery for /health (written only when it changes). Never raises."""
    try:
        await db.execute(Q.alert_delivery_note, {"ok": result.delivered, "error": result.reason or None})
    except Exception as exc:  # /health is told next time; the alert itself is handled by the caller
        log.debug("could not note the alert delivery's outcome: %s", exc)


def backoff(tries: int) -> float:
    """Seconds before the next delivery of an alert that failed ``tries + 1`` times."""
    return min(MAX_BACKOFF_SECONDS, 0.5 * 2.0 ** min(tries, 16))


def job_failed_text(job_id: int, kind: str, attempts: int, error: object) -> str:
    """The alert for a job that ended in ``failed`` (README, Alerts: id, kind and error)."""
    plural = "" if attempts == 1 else "s"
    return f"autom: job {job_id} ({kind}) failed after {attempts} attempt{plural}: {one_line(str(error), 500)}"


def summary_text(rows: Sequence[Row], limit: int = SUMMARY_CHARS) -> str:
    """ONE message for the failed jobs of ``rows`` (alerts held back): how many, of which
    kinds, their ids (as many as fit in ``limit`` characters, the lowest first) and where
    to see all of them (the console's failed list, ``autom failed``)."""
    count = len(rows)
    kinds = Counter(str(r["kind"]) for r in rows)
    shown = kinds.most_common(10)
    by_kind = ", ".join(f"{kind}: {n}" for kind, n in shown) + (", …" if len(kinds) > len(shown) else "")
    jobs = "job" if count == 1 else "jobs"
    head = f"autom: {count} {jobs} failed for good, too many at once for one alert each ({by_kind}): {jobs} "
    tail = (f". All of them: the console's {FAILED_LIST} (or `autom failed --limit {max(count, 20)}`)")
    ids = sorted(int(r["job_id"]) for r in rows)
    named: list[str] = []
    room = limit - len(head) - len(tail) - 20  # 20: room for ", … and N more"
    for job_id in ids:
        room -= len(str(job_id)) + 2
        if room < 0:
            break
        named.append(str(job_id))
    rest = len(ids) - len(named)
    return head + ", ".join(named) + (f", … and {rest} more" if rest else "") + tail


class AlertThrottle:
    """At most ``limit`` single alerts per rolling ``window`` seconds, then ONE summary.

    Pure logic, time passed in (``now``, any monotonic clock in seconds). The sender
    asks ``has_room(now)`` before a single alert and calls ``sent(now)`` once Telegram
    accepted it: a failed delivery takes no slot, so retries cannot crowd out the alert
    they retry. Alerts that find no room are held and go out together in one summary
    at ``summary_at(held_since)``: ``gather`` seconds after the first was held (so a
    burst lands in one message) and at most one summary per ``window``;
    ``summarised(now)`` records one. While a summary is pending, newer alerts join it
    instead of overtaking it.
    """

    def __init__(self, limit: int = 5, window: float = 60.0, gather: float = 5.0) -> None:
        if limit < 1 or window <= 0 or gather < 0:
            raise ValueError("an alert throttle needs limit >= 1, window > 0 and gather >= 0")
        self.limit = limit
        self.window = window
        self.gather = gather
        self._sent: deque[float] = deque()
        self._last_summary: float | None = None

    def has_room(self, now: float) -> bool:
        """Whether a single alert may go out at ``now``."""
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()
        return len(self._sent) < self.limit

    def sent(self, now: float) -> None:
        """A single alert was delivered at ``now`` (it takes a slot for ``window`` seconds)."""
        self._sent.append(now)

    def summary_at(self, held_since: float) -> float:
        """When the summary of alerts held since ``held_since`` may go out."""
        due = held_since + self.gather
        if self._last_summary is not None:
            due = max(due, self._last_summary + self.window)
        return due

    def summarised(self, now: float) -> None:
        """A summary was delivered at ``now``."""
        self._last_summary = now


class AlertSender:
    """Sends the outbox's alerts for one process (module docstring)."""

    def __init__(self, deps: Deps, throttle: AlertThrottle | None = None) -> None:
        self.deps = deps
        self.db = deps.db
        self.telegram = deps.telegram
        self.bell = deps.alert_bell
        self.throttle = throttle if throttle is not None else AlertThrottle()
        # a claim outlives a few complete sends (each bounded by the HTTP deadline)
        self.lease = 3 * deps.settings.http_timeout_seconds + 5.0
        self._held: dict[int, Row] = {}
        self._held_since: float | None = None
        #: the alert chat's next turn (its send limit, shared by every replica), trio clock
        self._turn_at = -math.inf
        # delivered but not marked yet (the mark failed): marked first thing next round
        self._unmarked: list[tuple[str, list[Row]]] = []
        self._round = trio.Lock()  # ``flush`` at shutdown may meet a round of ``run``

    # -- the loop --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send alerts as they are rung or found, forever (cancel it; ``flush`` first)."""
        task_status.started()
        failing = False
        while True:
            seen = self.bell.doorbell.count
            try:
                await self.send_round()
            except Exception as exc:  # the database is away: the rows wait for the next round
                # one warning per outage, not one every POLL_SECONDS
                log.log(logging.DEBUG if failing else logging.WARNING,
                        "alert round failed; trying again every %gs: %s", POLL_SECONDS, one_line(str(exc)))
                failing = True
            else:
                if failing:
                    log.info("alert rounds work again")
                failing = False
            wait = POLL_SECONDS
            if self._held_since is not None and not failing:  # failing: no hurry into the next failure
                wait = min(wait, self._summary_at() - trio.current_time())
            with trio.move_on_after(max(0.0, wait)):
                await self.bell.doorbell.wait_after(seen)

    async def flush(self) -> None:
        """At shutdown: send this process's alerts now, held ones as a summary at once."""
        await self.send_round(final=True)

    async def send_round(self, *, final: bool = False) -> None:
        """One look: mark what is delivered, claim what is due, send, summarise when due."""
        async with self._round:
            await self._look(final=final)

    async def _look(self, *, final: bool) -> None:
        await self._mark_unmarked()
        if self._held:
            await self._renew([])
        rows = await self.db.fetch_all(Q.alerts_claim, {
            "mine": self.bell.take(), "grace": ORPHAN_SECONDS, "lease": self.lease, "limit": CLAIM_LIMIT,
            "claimant": uuid.uuid4().hex,
        })
        await self._send_singles(sorted(rows, key=lambda r: r["id"]))
        if self._held and (final or trio.current_time() >= self._summary_at()):
            await self._send_summary()
        for _ in range(FINAL_TURNS if final else 0):  # at shutdown: wait for the chat's turn (bounded)
            if not self._held or self._turn_at <= trio.current_time():
                break
            await trio.sleep(self._turn_at - trio.current_time())
            await self._send_summary()

    def _summary_at(self) -> float:
        """When the held alerts go out: the throttle's time for a summary, and the alert chat's turn."""
        return max(self.throttle.summary_at(self._held_since or 0.0), self._turn_at)

    async def _renew(self, rows: Sequence[Row]) -> set[int]:
        """Extend the claims on ``rows`` and on the held rows; returns the ids still ours.

        Held rows another sender claimed meanwhile are dropped: that sender sends them.
        """
        every = [*rows, *self._held.values()]
        kept = {r["id"] for r in await self.db.fetch_all(Q.alerts_renew, {**_claims(every), "lease": self.lease})}
        for lost in [i for i in self._held if i not in kept]:
            del self._held[lost]
            log.info("held alert %d was taken over by another sender", lost)
        if not self._held:
            self._held_since = None
        return kept

    # -- sending ---------------------------------------------------------------------

    async def _send_singles(self, rows: Sequence[Row]) -> None:
        for index, row in enumerate(rows):
            now = trio.current_time()
            if self._held or not self.throttle.has_room(now) or now < self._turn_at:
                self._hold(row, now)
                continue
            # each send may take the whole HTTP timeout: first make sure every row this
            # sender holds is still its own and stays so for a full lease
            kept = await self._renew(rows[index:])
            if row["id"] not in kept:
                log.info("alert %d was taken over by another sender", row["id"])
                continue
            text = job_failed_text(row["job_id"], row["kind"], row["attempts"], row["error"] or "(no error text)")
            result = await self.telegram.deliver_alert(text)
            if result.held:  # the alert chat's turn has not come: this and the rest go in its next message
                self._turn_at = trio.current_time() + result.retry_after
                for waiting in rows[index:]:
                    self._hold(waiting, trio.current_time())
                return
            if result.delivered:
                self.throttle.sent(trio.current_time())
                self.deps.metrics.alerts.labels("sent").inc()
                await self._mark("single", [row])
                await note_delivery(self.db, result)  # after the mark, which matters more
                continue
            # Telegram is down (or refuses): try this one later, and the rest with it
            self.deps.metrics.alerts.labels("failed").inc()
            delay = max(backoff(row["tries"]), min(result.retry_after, MAX_RETRY_AFTER_SECONDS))
            await self._release([row], delay, failed=True)
            await self._release(rows[index + 1:], delay, failed=False)
            await note_delivery(self.db, result)
            return

    def _hold(self, row: Row, now: float) -> None:
        if self._held_since is None:
            self._held_since = now
        self._held[row["id"]] = row
        self.deps.metrics.alerts.labels("suppressed").inc()
        text = job_failed_text(row["job_id"], row["kind"], row["attempts"], row["error"] or "")
        log.info("alert suppressed by the throttle: %s", one_line(text, 120))

    async def _send_summary(self) -> None:
        await self._renew([])
        held = list(self._held.values())
        if not held:
            return
        if len(held) == 1:  # a summary of one says less than the alert itself
            only = held[0]
            text = job_failed_text(only["job_id"], only["kind"], only["attempts"], only["error"] or "(no error text)")
        else:
            text = summary_text(held)
        result = await self.telegram.deliver_alert(text)
        if result.held:  # the alert chat's turn has not come: all of them wait for it
            self._turn_at = trio.current_time() + result.retry_after
            return
        self._held.clear()
        self._held_since = None
        if result.delivered:
            self.throttle.summarised(trio.current_time())
            self.deps.metrics.alerts.labels("sent").inc()
            await self._mark("summary" if len(held) > 1 else "single", held)
        else:
            self.deps.metrics.alerts.labels("failed").inc()
            delay = max(backoff(max(r["tries"] for r in held)), min(result.retry_after, MAX_RETRY_AFTER_SECONDS))
            await self._release(held, delay, failed=True)
        await note_delivery(self.db, result)  # after the bookkeeping, which matters more

    # -- bookkeeping -----------------------------------------------------------------

    async def _mark(self, sent_as: str, rows: list[Row]) -> None:
        try:
            await self.db.execute(Q.alerts_mark_sent, {**_claims(rows), "sent_as": sent_as})
        except Exception as exc:  # delivered all the same: mark it next round, before its lease ends
            log.warning("could not mark %d alert(s) sent; trying again: %s", len(rows), one_line(str(exc)))
            self._unmarked.append((sent_as, rows))

    async def _mark_unmarked(self) -> None:
        while self._unmarked:
            sent_as, rows = self._unmarked[0]
            await self.db.execute(Q.alerts_mark_sent, {**_claims(rows), "sent_as": sent_as})
            self._unmarked.pop(0)

    async def _release(self, rows: Sequence[Row], delay: float, *, failed: bool) -> None:
        if rows:
            await self.db.execute(Q.alerts_release, {**_claims(rows), "delay": delay, "failed": int(failed)})


def _claims(rows: Sequence[Row]) -> dict[str, list[Any]]:
    """The (id, claimant) pairs of ``rows`` as the guarded statements take them."""
    return {"ids": [r["id"] for r in rows], "claimants": [r["claimant"] for r in rows]}
