"""Telegram's send limits, shared by every replica through PostgreSQL (how and why: docs/design/telegram.md).

``SendLimiter`` keeps per chat the earliest time of its next message (TELEGRAM_CHAT_RATE a
second; groups also ``GROUP_PER_MINUTE`` a minute), one GCRA budget of TELEGRAM_GLOBAL_RATE a
second for the bot's slots and one for the sends it actually made. ``acquire`` takes the right
to send now, or reserves the job's next slot and raises ``Defer`` to exactly it; ``pushed``
records a 429 (that chat waits; every send waits only when most recent sends were refused).
Waits are counted (``autom_telegram_waits_total``) and logged at most once a minute per
reason. Long texts are split (``split_text``); ``block`` marks a chat that blocked the bot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from autom.db.queries import Q
from autom.errors import ChatBlocked, DatabaseUnavailable, Defer, QueryError

if TYPE_CHECKING:
    from autom.config import Settings
    from autom.db.bridge import Database
    from autom.jobs.models import Job
    from autom.metrics import Metrics

log = logging.getLogger("autom.telegram")

#: Telegram's limit for a group chat.
GROUP_PER_MINUTE = 20
#: This many 429s within ``FLOOD_WINDOW`` seconds pause all sends, when they are also at
#: least half the recent sends (the budget row's ``flood_share``, over ``flood_memory``
#: seconds). Telegram's retry_after is about the request it refused;
#: its limit on the bot shows as most sends refused, not as a few among many.
FLOOD_THRESHOLD = 3
FLOOD_WINDOW = 10.0
#: Telegram's limit on a message text, in UTF-16 code units.
MAX_TEXT = 4096
#: The kinds of a chat's jobs that a block cancels (README, Telegram): those made to talk
#: to the chat. A user's own kinds go on, and are cancelled only when they send to it.
CHAT_KINDS = ("telegram.send", "telegram.message", "telegram.callback", "telegram.edited")
#: How long one try at recording a part sent may take before it is tried again.
RECORD_TRY_SECONDS = 5.0
#: How long recording a send made (``SendLimiter.sent``) may take before it is given up.
SENT_RECORD_SECONDS = 1.0
#: At most one log line per wait reason in this many seconds (the rest are counted).
WAIT_LOG_SECONDS = 60.0
#: A job's send that could not reach the limits (the database away) is deferred this long,
#: its attempt not counted: nothing was sent, and its handler is not at fault.
UNREACHABLE_DEFER_SECONDS = 2.0


@dataclass
class WaitLog:
    """Which waits to log: the first of a reason, then at most one per ``every`` seconds,
    saying how many waited since. Pure: ``now`` is passed in (any monotonic clock)."""

    every: float = WAIT_LOG_SECONDS
    _last: dict[str, float] = field(default_factory=dict)
    _since: dict[str, int] = field(default_factory=dict)

    def note(self, reason: str, now: float) -> int | None:
        """A wait for ``reason`` at ``now``: the number of waits to report in one line
        (this one included), or None when it is only counted."""
        self._since[reason] = self._since.get(reason, 0) + 1
        last = self._last.get(reason)
        if last is not None and now - last < self.every:
            return None
        self._last[reason] = now
        return self._since.pop(reason)


class SendLimiter:
    """The send limits of one bot, shared through ``db`` by every replica (module docstring)."""

    def __init__(self, db: Database, *, chat_rate: float, global_rate: float) -> None:
        """``chat_rate`` and ``global_rate`` in sends per second (TELEGRAM_CHAT_RATE, TELEGRAM_GLOBAL_RATE)."""
        self._db = db
        self.chat_interval = 1.0 / chat_rate
        self.group_interval = max(self.chat_interval, 60.0 / GROUP_PER_MINUTE)
        self.global_interval = 1.0 / global_rate
        self.burst = max(1.0, global_rate)
        #: set by the service: waits are counted in ``autom_telegram_waits_total``
        self.metrics: Metrics | None = None
        #: set by the service: told in how many seconds a job it moved to its chat's next
        #: slot is due, so this process's workers look for it then (not at their next poll)
        self.on_due: Callable[[float], None] | None = None
        self._waits = WaitLog()

    @classmethod
    def from_settings(cls, db: Database, settings: Settings) -> SendLimiter:
        """The limiter for TELEGRAM_CHAT_RATE and TELEGRAM_GLOBAL_RATE."""
        return cls(db, chat_rate=settings.telegram_chat_rate, global_rate=settings.telegram_global_rate)

    def interval(self, chat_id: int | str) -> float:
        """Seconds between two messages to ``chat_id`` (group chats have negative ids)."""
        return self.group_interval if str(chat_id).startswith("-") else self.chat_interval

    async def acquire(self, chat_id: int | str, *, parts: int = 1, priority: bool = False,
                      interval: float | None = None, job: Job | None = None) -> None:
        """Take the right to send ``parts`` messages to ``chat_id`` now, or raise ``Defer``.

        ``job``: the claim the send is for. When it must wait, its next slot (the chat's,
        the group's and the bot's budget's) is reserved for it and ``Defer`` names exactly
        that wait, so the job's next run takes its slot without waiting again. Without a
        job (alerts) nothing is taken and ``Defer`` says how long to wait. The job's
        recipient line, when it is this chat, has its next job (of ``CHAT_KINDS``) moved
        to the chat's next slot, so that it is not claimed only to wait. A job that comes
        back after its slot, however late (its workers lagged), sends on it and takes no
        new one when the sends the bot actually made (the budget row's ``sent_tat``) leave
        room for it now; else (the workers are catching up) it takes the next slot.
        With a job, the database not answering (``DatabaseUnavailable``, a transient
        ``QueryError``) defers the job ``UNREACHABLE_DEFER_SECONDS`` (nothing was sent: the
        attempt is not counted); without one (alerts) it is raised.

        ``interval``: the chat's spacing in seconds instead of ``interval(chat_id)`` (0: the
        bot's budget alone, as for answering button presses, which go to no chat).
        ``priority`` (alerts): keeps to a pause only, not to the chat's spacing (the alert
        sender spaces its messages) nor to the budget's wait (the budget is charged all the
        same, so later slots make up for it).

        The reservation commits with ``synchronous_commit = off`` for its own transaction
        only (``telegram_acquire``): a reservation lost in a crash of the database
        *server* is harmless (the chat's next message, or the bot's budget, may then go a
        little early once; a 429 to it is handled like any other). ``pushed`` keeps the
        server's setting (a 429 hold lost in a crash would let a flood go on).
        """
        try:
            row = await self._db.fetch_one(Q.telegram_acquire, {
                "chat": str(chat_id), "parts": max(1, parts),
                "chat_interval": self.interval(chat_id) if interval is None else interval,
                "global_interval": self.global_interval, "burst": self.burst, "priority": priority,
                "job": job.id if job is not None else None, "line": job.recipient if job is not None else None,
                "line_kinds": list(CHAT_KINDS),
            }, prepare=True)
        except (DatabaseUnavailable, QueryError) as exc:
            deferred = self._unreachable(exc, f"chat {chat_id}", job is not None)
            if deferred is None:
                raise
            raise deferred from exc
        wait = float((row or {}).get("wait") or 0.0)
        line_in = (row or {}).get("line_in")
        if line_in is not None and self.on_due is not None:
            self.on_due(float(line_in))
        if wait < 0:
            raise ChatBlocked(f"telegram: chat {chat_id} blocked the bot (marked until an update from it "
                              "arrives); not sent", chat_id=chat_id)
        if wait:
            reason = str((row or {}).get("reason") or "chat")
            text = (f"telegram: chat {chat_id} {'has its slot' if job is not None else 'must wait'} in "
                    f"{wait:.2f}s ({_REASONS.get(reason, reason)})")
            self.waited(reason, text, job)
            deferred = Defer(text, after=wait)
            deferred.quiet = True  # counted and logged here, not once per job
            raise deferred

    async def sent(self, chat_id: int | str, *, interval: float | None = None, job: Job | None = None) -> None:
        """A message to ``chat_id`` was sent and Telegram answered: the chat's next one goes no
        sooner than its interval from now (``sent_next_at``, migrations/0038), in every replica;
        ``job``'s line, when it is the chat, has its next job moved there too (``on_due`` told).

        The take records the same from its own moment; the send reaches Telegram later, by
        however long this process took to make it (a busy process: tens of milliseconds), so
        two sends taken exactly an interval apart could arrive closer. Telegram's answer comes
        after the message arrived: counted from it, they cannot. Best effort: the database
        not answering within ``SENT_RECORD_SECONDS`` is logged at debug (the take's record
        stands), so a send made just before the database went away is not held up by it."""
        spacing = self.interval(chat_id) if interval is None else interval
        if spacing <= 0:
            return
        line_in = None
        with trio.move_on_after(SENT_RECORD_SECONDS) as scope:
            try:
                line_in = await self._db.fetch_val(Q.telegram_sent, {
                    "chat": str(chat_id), "interval": spacing, "job": job.id if job is not None else None,
                    "line": job.recipient if job is not None else None, "line_kinds": list(CHAT_KINDS),
                }, prepare=True)
            except (DatabaseUnavailable, QueryError) as exc:
                log.debug("could not record a send to chat %s: %s", chat_id, exc)
        if scope.cancelled_caught:
            log.debug("could not record a send to chat %s within %.1f s", chat_id, SENT_RECORD_SECONDS)
        if line_in is not None and self.on_due is not None:
            self.on_due(float(line_in))

    async def space(self, chat_id: int | str) -> float:
        """An alert's turn in ``chat_id``: 0.0 when its spacing allows a message now (taken),
        else the seconds to wait (nothing taken). ``acquire(priority=True)`` skips the chat's
        spacing; this keeps the alerts of every replica together to it (a group's 20 a minute)."""
        wait = await self._db.fetch_val(Q.telegram_chat_space, {"chat": str(chat_id),
                                                                "interval": self.interval(chat_id)})
        return float(wait or 0.0)

    def _unreachable(self, exc: DatabaseUnavailable | QueryError, what: str, job: bool) -> Defer | None:
        """What a send that could not ask the database before sending raises instead of ``exc``:
        a ``Defer`` of ``UNREACHABLE_DEFER_SECONDS`` for a job's send (``job``; nothing was sent:
        counted and logged as a wait, reason ``database``); None: ``exc`` itself (alerts, a
        lasting QueryError)."""
        if not job or (isinstance(exc, QueryError) and not exc.transient):
            return None
        text = f"telegram: {what} not sent, the database did not answer ({exc})"
        self.waited("database", text)
        deferred = Defer(text, after=UNREACHABLE_DEFER_SECONDS)
        deferred.quiet = True  # counted and logged by ``waited``
        return deferred

    def waited(self, reason: str, text: str, job: Job | None = None) -> None:
        """Count one wait for ``reason`` and log it, at most one line a minute per reason."""
        if self.metrics is not None:
            self.metrics.telegram_waits.labels(reason).inc()
        count = self._waits.note(reason, trio.current_time())
        if count is not None:
            log.info("%d telegram sends waited for %s (the last minute, this replica); the latest: %s",
                     count, _REASONS.get(reason, reason), text,
                     extra={"job_id": job.id if job is not None else None, "reason": reason, "waits": count})

    async def pushed(self, chat_id: int | str, retry_after: float) -> None:
        """Telegram answered ``chat_id`` with 429 and ``retry_after``: hold its sends (all replicas),
        moving its reserved slots (and their jobs) past the hold. ``FLOOD_THRESHOLD`` 429s within
        ``FLOOD_WINDOW`` seconds that are also half the recent sends (Telegram refusing most of
        them) pause all sends, moving every reserved slot past the pause; a few among many
        (each chat's own) pause nothing else. The database not answering is logged, not
        raised: the refused send is deferred by its caller all the same."""
        try:
            paused = await self._db.fetch_val(Q.telegram_pushed, {
                "chat": str(chat_id), "after": max(0.0, retry_after),
                "threshold": FLOOD_THRESHOLD, "window": FLOOD_WINDOW,
            })
        except (DatabaseUnavailable, QueryError) as exc:
            if isinstance(exc, QueryError) and not exc.transient:
                raise
            # the refused job is deferred by retry_after all the same (its caller's Defer);
            # the other replicas' sends to the chat find out with their own 429
            log.warning("could not record telegram's 429 for chat %s (%s): its job waits all the same",
                        chat_id, exc, extra={"recipient": str(chat_id)})
            return
        if paused:
            log.warning("telegram answered 429 to most recent sends: all sends pause for %.0fs",
                        retry_after, extra={"delay_s": retry_after})


    async def block(self, chat_id: int | str, reason: str, *, job_id: int | None = None) -> int:
        """Mark ``chat_id`` blocked (``reason``: Telegram's answer) and cancel its pending jobs of
        ``CHAT_KINDS`` but ``job_id``; returns how many were cancelled. No alert for any of them."""
        cancelled = await self._db.fetch_val(Q.telegram_block, {
            "chat": str(chat_id), "reason": reason, "kinds": list(CHAT_KINDS), "job_id": job_id or 0,
            "error": f"cancelled: chat {chat_id} blocked the bot ({reason})",
        })
        log.info("telegram chat %s blocked the bot: marked, %d pending jobs cancelled", chat_id, cancelled,
                 extra={"recipient": str(chat_id), "job_id": job_id})
        return int(cancelled or 0)

    async def blocked(self, chat_id: int | str) -> dict[str, Any] | None:
        """``{"chat_id", "blocked_at", "reason"}`` if ``chat_id`` is marked blocked, else None."""
        return await blocked_chat(self._db, chat_id)

    async def parts_sent(self, job_id: int, slot: str) -> tuple[int, int | None]:
        """How many parts of the split send ``slot`` of job ``job_id`` an earlier run sent, and the
        message_id of the last of them: ``(0, None)`` when none. Asked before anything is sent:
        the database not answering defers the job (as in ``acquire``)."""
        try:
            found = await self._db.fetch_val(Q.telegram_parts_sent, {"job_id": job_id, "slot": slot})
        except (DatabaseUnavailable, QueryError) as exc:
            deferred = self._unreachable(exc, f"job {job_id}'s split text", True)
            if deferred is None:
                raise
            raise deferred from exc
        if not isinstance(found, list) or len(found) != 2:
            return 0, None
        return int(found[0]), None if found[1] is None else int(found[1])

    async def record_parts(self, job: Job, slot: str, sent: int, message_id: int | None, *,
                           within: float) -> bool:
        """Record that ``sent`` parts of ``slot`` went out (the last as ``message_id``), fenced by
        ``job``'s lease; False when the claim no longer holds the job (nothing written).

        A part was sent, so its record is tried again through database outages (each try
        bounded by ``RECORD_TRY_SECONDS``) for up to ``within`` seconds (the lease: past it
        the claim is lost anyway), then the last error is raised.
        """
        params = {"job_id": job.id, "lease": job.lease, "slot": slot, "sent": sent, "message_id": message_id}
        give_up = trio.current_time() + max(within, RECORD_TRY_SECONDS)
        pause = 0.05
        while True:
            try:
                with trio.fail_after(RECORD_TRY_SECONDS):
                    return await self._db.fetch_one(Q.telegram_parts_record, params) is not None
            except (DatabaseUnavailable, QueryError, trio.TooSlowError) as exc:
                if (isinstance(exc, QueryError) and not exc.transient) or trio.current_time() >= give_up:
                    raise
                log.warning("could not record telegram part %d of job %d (%s); trying again", sent, job.id, exc,
                            extra={"job_id": job.id})
                await trio.sleep(pause)
                pause = min(1.0, pause * 2)


_REASONS = {
    "chat": "the chat's spacing", "global": "the bot's budget", "pause": "a pause of all sends",
    "held": "a reserved slot", "refused": "Telegram's 429", "sends": "the bot's sends made (a catch-up)",
    "database": "the database (not reachable)",
}


async def blocked_chat(db: Database, chat_id: int | str) -> dict[str, Any] | None:
    """``{"chat_id", "blocked_at", "reason"}`` if ``chat_id`` is marked blocked, else None."""
    return await db.fetch_one(Q.telegram_blocked_chat, {"chat": str(chat_id)})


async def blocked_chats(db: Database, limit: int = 100) -> list[dict[str, Any]]:
    """The chats marked blocked, the latest first (at most ``limit``)."""
    return await db.fetch_all(Q.telegram_blocked_chats, {"limit": limit})


def split_text(text: str, limit: int = MAX_TEXT) -> list[str]:
    """``text`` in parts of at most ``limit`` UTF-16 code units, cut after a line where possible.

    Telegram counts UTF-16 units (an emoji counts twice); a surrogate pair is never
    split. A part ends at the last line break that fits, else at the last space, else
    wherever the limit falls. Nothing is lost: the parts joined are the text.
    """
    if units(text) <= limit:
        return [text]
    parts: list[str] = []
    rest = text
    while units(rest) > limit:
        end = _fit(rest, limit)  # characters that fit
        cut = rest.rfind("\n", 0, end) + 1
        if cut <= end // 2:  # no line break in the second half: try a space
            cut = rest.rfind(" ", 0, end) + 1
        if cut <= end // 2:
            cut = end
        parts.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        parts.append(rest)
    return parts


def _fit(text: str, limit: int) -> int:
    """How many characters of ``text`` fit in ``limit`` UTF-16 units."""
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > limit:
            return index
    return len(text)


def units(text: str) -> int:
    """``text``'s length in UTF-16 code units, as Telegram counts it."""
    return len(text.encode("utf-16-le")) // 2
