"""Nobody notices → somebody is told: alerts for a stuck queue and a silent heartbeat.

Every 30 s each replica checks the queue lag (age of the oldest due pending job)
against QUEUE_LAG_ALERT_SECONDS, and when the heartbeat last ran: it is silent once two
of its slots have passed since (``heartbeat_deadline``). A condition
alerts once when it starts and once when it clears: the transition is one
guarded statement (``alert_state_flip``), so of several replicas only one sends it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, tzinfo

import trio

from autom.alerts import note_delivery
from autom.db.queries import Q
from autom.deps import Deps
from autom.jobs import health
from autom.schedule import Schedule, next_due

log = logging.getLogger("autom.watchdog")

CHECK_SECONDS = 30.0


def heartbeat_schedule(schedules: Sequence[Schedule]) -> Schedule | None:
    """The heartbeat's schedule, or None when no heartbeat is scheduled."""
    return next((spec for spec in schedules if spec.kind == "heartbeat"), None)


def heartbeat_deadline(spec: Schedule, last: float, tz: tzinfo | None) -> float:
    """When a heartbeat last seen at ``last`` (epoch seconds) counts as silent.

    ``every_minutes``: two periods after it. ``daily_at`` and ``cron``: the second slot of
    the schedule after it, in the schedule's zone ``tz`` (None: the process's), so a
    weekday cron's Friday beat is not missed over the weekend, and a cron every 5 minutes
    is missed after about 10 minutes, not two days.
    """
    if spec.every_minutes is not None:
        return last + 2 * 60.0 * spec.every_minutes
    first = next_due(spec, datetime.fromtimestamp(last, UTC), tz)
    return next_due(spec, first, tz).timestamp()


class Watchdog:
    """Checks the two conditions and alerts on their changes."""

    def __init__(
        self, deps: Deps, schedules: Sequence[Schedule], *, tz: tzinfo | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Watch for ``deps``; ``tz`` is the schedules' zone (the ticker's); ``clock`` is wall
        time in seconds (the heartbeat's ``updated_at`` is too)."""
        self.deps = deps
        self.heartbeat = heartbeat_schedule(schedules)
        self.tz = tz
        self._clock = clock
        self.started = clock()

    async def check(self) -> dict[str, bool]:
        """One round: returns each condition's current state (True = alarming)."""
        settings = self.deps.settings
        lag = await health.queue_lag(self.deps.db)
        states = {"queue_lag": lag > settings.queue_lag_alert_seconds}
        await self._flip("queue_lag", states["queue_lag"],
                         f"autom: queue lag is {lag:.0f}s (over {settings.queue_lag_alert_seconds:g}s): "
                         "jobs are waiting; are the workers running?",
                         "autom: queue lag is back to normal")
        if self.heartbeat is not None:
            row = await self.deps.db.fetch_one(Q.state_get, {"name": "heartbeat"})
            last = row["updated_at"].timestamp() if row else self.started
            now = self._clock()
            silent = now - last
            states["heartbeat"] = now > heartbeat_deadline(self.heartbeat, last, self.tz)
            await self._flip("heartbeat", states["heartbeat"],
                             f"autom: no heartbeat for {silent / 60:.0f} min (expected "
                             f"{self.heartbeat.describe()}): the queue may be stuck",
                             "autom: heartbeat is back")
        return states

    async def _flip(self, name: str, active: bool, on_text: str, off_text: str) -> None:
        changed = await self.deps.db.fetch_one(Q.alert_state_flip, {"name": f"alert:{name}", "active": active})
        if changed is None or (changed["inserted"] and not active):
            return
        text = on_text if active else off_text
        (log.error if active else log.info)(text)
        result = await self.deps.telegram.deliver_alert(text)
        await note_delivery(self.deps.db, result)
        self.deps.metrics.alerts.labels("sent" if result.delivered else "failed").inc()

    async def run(self, *, interval: float = CHECK_SECONDS,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check every ``interval`` seconds forever (cancel it); database errors are logged."""
        task_status.started()
        while True:
            try:
                await self.check()
            except Exception as exc:  # a failed check must not stop the next one
                log.warning("watchdog check failed: %s", exc)
            await trio.sleep(interval)
