"""Schedule specs and their slots: which run of a recurring job is due at a given moment.

This module is the pure part of the schedule (time is passed in). The ticker
calls ``slot(spec, now, tz)`` every 30 s and enqueues ``job_key(spec, slot)``
with that key; the job's unique key makes the enqueue idempotent, so replicas
and restarts never run a slot twice, and a slot missed while the service was
down still runs when it comes back within the same period (the current slot is
simply due "now").

Two kinds of spec (README, "Schedule"):

* ``every_minutes=n``: slots on UTC boundaries. A slot starts at
  ``floor(epoch_minutes / n) * n`` and its key is its start, ``2026-11-29T14:00Z``.
  For ``n`` dividing 1440 (1, 5, 15, 30, 60, 90, 120, ..., 1440) that lands on the
  same clock times every UTC day (90 → 00:00, 01:30, 03:00, ...). Any other ``n``
  (7, 100, 2880) is allowed and still gives evenly spaced slots exactly ``n``
  minutes apart, aligned to the Unix epoch, so their clock times drift from one
  day to the next.
* ``daily_at="HH:MM"``: once per local date in ``tz``, due once the local time
  reaches HH:MM; the key is the local date, ``2026-11-29``. On a spring-forward
  day when HH:MM does not exist it is due at the next minute that does (02:30 in
  Europe/Berlin on 2026-03-29 → 03:00); on a fall-back day when HH:MM occurs twice
  it is due from the first occurrence, and the key (the date) makes it run once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_HH_MM = re.compile(r"(\d{2}):(\d{2})")

# Longest run of local minutes that may not exist (a DST gap is an hour, Lord Howe half an
# hour, Samoa's 2011 date-line jump a whole day). Bounds the search for the next minute.
_MAX_GAP = timedelta(hours=48)


@dataclass(frozen=True)
class Schedule:
    """A recurring job: ``kind`` with ``payload``, either every N minutes or daily at HH:MM (local).

    Exactly one of ``every_minutes`` (an integer ≥ 1) and ``daily_at`` ("HH:MM",
    00:00–23:59) must be given; anything else raises ``ValueError``.
    """

    kind: str
    every_minutes: int | None = None
    daily_at: str | None = None
    payload: dict[str, Any] = field(default_factory=dict, hash=False)
    #: stored in the slot's job (None: 8); the App sets it from the kind's handler
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if not self.kind:
            raise ValueError("a schedule needs a kind")
        if (self.every_minutes is None) == (self.daily_at is None):
            raise ValueError(f"schedule {self.kind!r}: give exactly one of every_minutes and daily_at")
        if self.every_minutes is not None:
            # bool is an int subclass: every_minutes=True is a mistake, not "every minute"
            if not isinstance(self.every_minutes, int) or isinstance(self.every_minutes, bool):
                raise ValueError(f"schedule {self.kind!r}: every_minutes must be a whole number")
            if self.every_minutes < 1:
                raise ValueError(f"schedule {self.kind!r}: every_minutes must be at least 1")
        if self.daily_at is not None:
            _parse_hh_mm(self.kind, self.daily_at)


#: The schedules autom runs when nothing else is configured (README, Schedule: heartbeat hourly).
DEFAULT_SCHEDULES: tuple[Schedule, ...] = (Schedule("heartbeat", every_minutes=60),)

#: What every App schedules: the hourly heartbeat and retention (README, Schedule).
BUILTIN_SCHEDULES: tuple[Schedule, ...] = (*DEFAULT_SCHEDULES, Schedule("maintenance.prune", every_minutes=60))


def slot(spec: Schedule, now: datetime, tz: tzinfo | None) -> str | None:
    """The key of the slot due at ``now`` (timezone-aware), or None if nothing is due yet.

    Interval specs always have a current slot. A daily spec has none before its time on
    the current local date (yesterday's slot has had its day). ``tz`` is the zone of
    ``daily_at`` (None: the process's zone, from TZ or /etc/localtime, else UTC); interval
    specs ignore it.
    """
    _require_aware(now)
    if spec.every_minutes is not None:
        return _interval_start(spec.every_minutes, now).strftime("%Y-%m-%dT%H:%MZ")
    zone = _zone(tz)
    today = now.astimezone(zone).date()
    if now >= _daily_due(spec, today, zone):
        return today.isoformat()
    # a daily time inside a gap that runs past midnight becomes due on the next local date;
    # that slot of yesterday's is then the one due now, until today's own time comes
    yesterday = today - timedelta(days=1)
    late = _daily_due(spec, yesterday, zone)
    if late.astimezone(zone).date() == today and now >= late:
        return yesterday.isoformat()
    return None


def job_key(spec: Schedule, slot_key: str) -> str:
    """The unique job key of ``spec``'s slot ``slot_key``: ``"{kind}:{slot_key}"``."""
    return f"{spec.kind}:{slot_key}"


def next_due(spec: Schedule, now: datetime, tz: tzinfo | None) -> datetime:
    """When the next slot after ``now`` becomes due (for logs and tests), in UTC.

    Interval specs: the start of the next slot. Daily specs: the first due time after
    ``now`` (a spring-forward day's 02:30 gives 03:00 local). UTC rather than ``tz``
    because an aware datetime inside a fall-back fold never compares equal to one in
    another zone (PEP 495); convert with ``.astimezone(tz)`` to display it.
    """
    _require_aware(now)
    if spec.every_minutes is not None:
        return _interval_start(spec.every_minutes, now) + timedelta(minutes=spec.every_minutes)
    zone = _zone(tz)
    today = now.astimezone(zone).date()
    candidates = (_daily_due(spec, today + timedelta(days=d), zone) for d in range(-1, 3))
    return min(due for due in candidates if due > now)


def _interval_start(every_minutes: int, now: datetime) -> datetime:
    # integer arithmetic on epoch minutes: exact, and independent of any zone
    epoch_minutes = int(now.timestamp() // 60)
    start = epoch_minutes // every_minutes * every_minutes
    return datetime.fromtimestamp(start * 60, UTC)


def _daily_due(spec: Schedule, day: date, zone: tzinfo) -> datetime:
    """The instant (UTC) at which ``spec``'s slot for local date ``day`` becomes due."""
    assert spec.daily_at is not None
    hour, minute = _parse_hh_mm(spec.kind, spec.daily_at)
    wall = datetime.combine(day, time(hour, minute))
    limit = wall + _MAX_GAP
    while wall < limit:
        instant = wall.replace(tzinfo=zone, fold=0)
        # a wall time exists iff it survives the round trip through UTC; fold=0 picks the
        # first of two occurrences on a fall-back day
        if instant.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall:
            return instant.astimezone(UTC)
        wall += timedelta(minutes=1)
    raise ValueError(f"schedule {spec.kind!r}: no existing local time near {day} {spec.daily_at}")


def _parse_hh_mm(kind: str, value: str) -> tuple[int, int]:
    match = _HH_MM.fullmatch(value) if isinstance(value, str) else None
    if match is None or int(match[1]) > 23 or int(match[2]) > 59:
        raise ValueError(f"schedule {kind!r}: daily_at must be HH:MM between 00:00 and 23:59, got {value!r}")
    return int(match[1]), int(match[2])


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")


def _zone(tz: tzinfo | None) -> tzinfo:
    return tz if tz is not None else process_zone()


@lru_cache(maxsize=1)
def process_zone() -> tzinfo:
    """The process's time zone as a DST-aware zone: $TZ, else /etc/localtime, else UTC.

    (``datetime.now().astimezone().tzinfo`` would be a fixed offset, wrong across a DST change.)
    """
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with open("/etc/localtime", "rb") as file:
            return ZoneInfo.from_file(file, key="localtime")
    except (OSError, ValueError):
        return UTC
