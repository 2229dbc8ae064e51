"""Schedule specs and their slots: which run of a recurring job is due at a given moment.

Pure: time is passed in. The ticker calls ``slot(spec, now, tz)`` every 30 s and
enqueues the slot's job with the key ``job_key(spec, slot)``; the unique key makes
that idempotent across replicas and restarts, and a slot missed while the service
was down is still due when it comes back within the same period. Three kinds of
spec: ``every_minutes`` (UTC boundaries, key ``2026-11-29T14:00Z``), ``daily_at``
(once per local date in TZ, key ``2026-11-29``) and ``cron`` (five fields in TZ,
read by cronsim; key the fire time in UTC, ``2026-11-29T14:05Z``). README, "Schedule".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

_HH_MM = re.compile(r"(\d{2}):(\d{2})")

# How far a clock may go back (cron's own threshold): a fire time this far after now's wall
# time may still lie before now, in the first pass of a repeated hour.
_MAX_FOLD = timedelta(hours=3)

# Longest run of local minutes that may not exist (a DST gap is an hour, Lord Howe half an
# hour, Samoa's 2011 date-line jump a whole day). Bounds the search for the next minute.
_MAX_GAP = timedelta(hours=48)


@dataclass(frozen=True)
class Schedule:
    """A recurring job: ``kind`` with ``payload``, every N minutes, daily at HH:MM or by a cron expression.

    Exactly one of ``every_minutes`` (an integer ≥ 1), ``daily_at`` ("HH:MM",
    00:00–23:59) and ``cron`` (five fields, "*/5 * * * *") must be given; anything
    else raises ``ValueError``.
    """

    kind: str
    every_minutes: int | None = None
    daily_at: str | None = None
    cron: str | None = None
    payload: dict[str, Any] = field(default_factory=dict, hash=False)
    #: stored in the slot's job (None: 8); the App sets it from the kind's handler
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if not self.kind:
            raise ValueError("a schedule needs a kind")
        if [self.every_minutes, self.daily_at, self.cron].count(None) != 2:
            raise ValueError(f"schedule {self.kind!r}: give exactly one of every_minutes, daily_at and cron")
        if self.every_minutes is not None:
            # bool is an int subclass: every_minutes=True is a mistake, not "every minute"
            if not isinstance(self.every_minutes, int) or isinstance(self.every_minutes, bool):
                raise ValueError(f"schedule {self.kind!r}: every_minutes must be a whole number")
            if self.every_minutes < 1:
                raise ValueError(f"schedule {self.kind!r}: every_minutes must be at least 1")
        if self.daily_at is not None:
            _parse_hh_mm(self.kind, self.daily_at)
        if self.cron is not None:
            _check_cron(self.kind, self.cron)

    def describe(self) -> str:
        """The spec for people: ``every 15 min``, ``daily at 09:00``, ``cron */5 * * * *``."""
        if self.every_minutes is not None:
            return f"every {self.every_minutes} min"
        if self.daily_at is not None:
            return f"daily at {self.daily_at}"
        return f"cron {self.cron}"


#: The schedules autom runs when nothing else is configured (README, Schedule: heartbeat hourly).
DEFAULT_SCHEDULES: tuple[Schedule, ...] = (Schedule("heartbeat", every_minutes=60),)

#: What every App schedules: the hourly heartbeat and retention (README, Schedule).
BUILTIN_SCHEDULES: tuple[Schedule, ...] = (*DEFAULT_SCHEDULES, Schedule("maintenance.prune", every_minutes=60))


def slot(spec: Schedule, now: datetime, tz: tzinfo | None) -> str | None:
    """The key of the slot due at ``now`` (timezone-aware), or None if nothing is due yet.

    Interval specs always have a current slot. A daily spec has none before its time on
    the current local date (yesterday's slot has had its day). A cron spec's slot is its
    latest fire time at or before ``now``. ``tz`` is the zone of ``daily_at`` and ``cron``
    (None: the process's zone, from TZ or /etc/localtime, else UTC); interval specs ignore it.
    """
    _require_aware(now)
    if spec.every_minutes is not None:
        return _utc_minute(_interval_start(spec.every_minutes, now))
    zone = _zone(tz)
    if spec.cron is not None:
        fired = _cron_latest(spec, now, zone)
        return None if fired is None else _utc_minute(fired)
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
    if spec.cron is not None:
        return _cron_next(spec, now, zone)
    today = now.astimezone(zone).date()
    candidates = (_daily_due(spec, today + timedelta(days=d), zone) for d in range(-1, 3))
    return min(due for due in candidates if due > now)


def _utc_minute(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _check_cron(kind: str, expr: str) -> None:
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(f"schedule {kind!r}: cron must have five fields (minute hour day month weekday), "
                         f"got {expr!r}")
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"schedule {kind!r}: cron {expr!r}: {exc}") from None


def _cron_fixed_time(expr: str) -> bool:
    """Whether ``expr`` fires at set times of day (neither minute nor hour starts with ``*``):
    as in Debian's cron, such a time that occurs twice when clocks go back fires once."""
    minute, hour = expr.split()[:2]
    return not minute.startswith("*") and not hour.startswith("*")


def _cron_instants(spec: Schedule, wall: datetime, zone: tzinfo) -> list[datetime]:
    """The instants (UTC) at which local wall time ``wall`` fires ``spec``: one, or two inside a
    repeated hour for an expression with ``*`` in its minute or hour; a wall time inside a gap
    fires at the next minute that exists."""
    assert spec.cron is not None
    first = _existing(wall, zone)
    if first is None:
        raise ValueError(f"schedule {spec.kind!r}: no existing local time near {wall}")
    if first.replace(tzinfo=None) != wall or _cron_fixed_time(spec.cron):
        return [first.astimezone(UTC)]
    second = wall.replace(tzinfo=zone, fold=1)
    return sorted({first.astimezone(UTC), second.astimezone(UTC)})


def _cron_latest(spec: Schedule, now: datetime, zone: tzinfo) -> datetime | None:
    """The latest instant (UTC) at or before ``now`` at which ``spec.cron`` fires in ``zone``.

    cronsim walks naive local wall times (no zone: no DST handling of its own); this maps
    them to instants. In the second pass of a repeated hour a wall time later than now's
    may have fired before now (in the first pass), so the walk starts up to 3 h later.
    """
    assert spec.cron is not None
    local = now.astimezone(zone)
    wall = local.replace(tzinfo=None, microsecond=0)
    best: datetime | None = None
    # cronsim's reverse walk returns times strictly before its start: start a second later
    for candidate in CronSim(spec.cron, wall + _MAX_FOLD + timedelta(seconds=1), reverse=True):
        for instant in _cron_instants(spec, candidate, zone):
            if instant <= now and (best is None or instant > best):
                best = instant
        if candidate <= wall:
            # an earlier wall time has no instant at or before now later than this one's
            return best
    return best


def _cron_next(spec: Schedule, now: datetime, zone: tzinfo) -> datetime:
    """The first instant (UTC) after ``now`` at which ``spec.cron`` fires in ``zone``."""
    assert spec.cron is not None
    wall = now.astimezone(zone).replace(tzinfo=None, microsecond=0)
    best: datetime | None = None
    for candidate in CronSim(spec.cron, wall - _MAX_FOLD - timedelta(minutes=1)):
        for instant in _cron_instants(spec, candidate, zone):
            if instant > now and (best is None or instant < best):
                best = instant
        if best is not None and candidate > wall + _MAX_FOLD:
            return best
    raise ValueError(f"schedule {spec.kind!r}: cron {spec.cron!r} never fires after {now}")


def _interval_start(every_minutes: int, now: datetime) -> datetime:
    # integer arithmetic on epoch minutes: exact, and independent of any zone
    epoch_minutes = int(now.timestamp() // 60)
    start = epoch_minutes // every_minutes * every_minutes
    return datetime.fromtimestamp(start * 60, UTC)


def _daily_due(spec: Schedule, day: date, zone: tzinfo) -> datetime:
    """The instant (UTC) at which ``spec``'s slot for local date ``day`` becomes due."""
    assert spec.daily_at is not None
    hour, minute = _parse_hh_mm(spec.kind, spec.daily_at)
    instant = _existing(datetime.combine(day, time(hour, minute)), zone)
    if instant is None:
        raise ValueError(f"schedule {spec.kind!r}: no existing local time near {day} {spec.daily_at}")
    return instant.astimezone(UTC)


def _existing(wall: datetime, zone: tzinfo) -> datetime | None:
    """The first existing local minute at or after naive ``wall`` in ``zone`` (aware, fold=0:
    the first of two occurrences), or None if none within two days."""
    limit = wall + _MAX_GAP
    while wall < limit:
        instant = wall.replace(tzinfo=zone, fold=0)
        # a wall time exists iff it survives the round trip through UTC
        if instant.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall:
            return instant
        wall += timedelta(minutes=1)
    return None


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
