"""autom.schedule: cron specs (five fields in TZ, through cronsim), with explicit `now`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from autom.schedule import Schedule, next_due, slot
from autom.ticker import due_jobs

BERLIN = ZoneInfo("Europe/Berlin")
KOLKATA = ZoneInfo("Asia/Kolkata")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def slots_over(spec: Schedule, start: datetime, minutes: int, tz: ZoneInfo) -> list[str]:
    """The distinct slots a ticker sees when ticking every 30 s for ``minutes`` from ``start``."""
    seen: list[str] = []
    for half in range(minutes * 2):
        key = slot(spec, start + timedelta(seconds=30 * half), tz)
        if key is not None and key not in seen:
            seen.append(key)
    return seen


def test_every_minute_has_one_slot_per_minute() -> None:
    spec = Schedule("tick", cron="* * * * *")
    assert slot(spec, utc(2026, 11, 29, 14, 7, 0), UTC) == "2026-11-29T14:07Z"
    assert slot(spec, utc(2026, 11, 29, 14, 7, 59, 999999), UTC) == "2026-11-29T14:07Z"
    assert slot(spec, utc(2026, 11, 29, 14, 8, 0), UTC) == "2026-11-29T14:08Z"
    assert next_due(spec, utc(2026, 11, 29, 14, 7, 30), UTC) == utc(2026, 11, 29, 14, 8)
    assert len(slots_over(spec, utc(2026, 11, 29, 14, 0), 60, BERLIN)) == 60


def test_every_five_minutes_latest_fire_time_at_or_before_now() -> None:
    spec = Schedule("poll", cron="*/5 * * * *")
    assert slot(spec, utc(2026, 11, 29, 14, 5), BERLIN) == "2026-11-29T14:05Z"
    assert slot(spec, utc(2026, 11, 29, 14, 9, 59), BERLIN) == "2026-11-29T14:05Z"
    # a missed slot is still due within its period (catch-up as the other specs)
    assert slot(spec, utc(2026, 11, 29, 14, 4, 59), BERLIN) == "2026-11-29T14:00Z"


def test_fields_are_local_time_in_tz() -> None:
    spec = Schedule("digest", cron="0 9 * * 1-5")  # 09:00 on weekdays, local
    # Monday 2026-11-30 09:00 in Berlin (CET, +1) is 08:00 UTC
    assert slot(spec, utc(2026, 11, 30, 7, 59), BERLIN) == "2026-11-27T08:00Z"  # Friday's
    assert slot(spec, utc(2026, 11, 30, 8, 0), BERLIN) == "2026-11-30T08:00Z"
    # a zone half an hour off UTC: the hour starts at :30 UTC
    hourly = Schedule("h", cron="0 * * * *")
    assert slot(hourly, utc(2026, 11, 30, 8, 29), KOLKATA) == "2026-11-30T07:30Z"
    assert next_due(hourly, utc(2026, 11, 30, 8, 29), KOLKATA) == utc(2026, 11, 30, 8, 30)


def test_spring_forward_every_five_minutes_and_a_time_in_the_gap() -> None:
    # Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC)
    every5 = Schedule("poll", cron="*/5 * * * *")
    seen = slots_over(every5, utc(2026, 3, 29, 0, 0), 120, BERLIN)
    assert len(seen) == 24 and len(set(seen)) == 24  # one slot per 5 real minutes, none lost
    at_0230 = Schedule("nightly", cron="30 2 * * *")
    # 02:30 does not exist that day: it fires at the next minute that does (03:00 CEST), once
    assert slots_over(at_0230, utc(2026, 3, 29, 0, 0), 180, BERLIN) == ["2026-03-28T01:30Z", "2026-03-29T01:00Z"]
    assert next_due(at_0230, utc(2026, 3, 29, 0, 0), BERLIN) == utc(2026, 3, 29, 1, 0)


def test_fall_back_every_five_minutes_runs_through_the_repeated_hour() -> None:
    # Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:00-03:00 happens twice
    every5 = Schedule("poll", cron="*/5 * * * *")
    seen = slots_over(every5, utc(2026, 10, 24, 23, 0), 240, BERLIN)
    expected = [f"{(utc(2026, 10, 24, 23, 0) + timedelta(minutes=5 * i)):%Y-%m-%dT%H:%MZ}" for i in range(48)]
    assert seen == expected  # every 5 real minutes, in order, the repeated hour too


def test_fall_back_a_set_time_in_the_repeated_hour_runs_once() -> None:
    at_0230 = Schedule("nightly", cron="30 2 * * *")
    seen = slots_over(at_0230, utc(2026, 10, 24, 23, 0), 240, BERLIN)
    # the first 02:30 (CEST, 00:30 UTC) is the day's slot, also through the second pass
    assert seen == ["2026-10-24T00:30Z", "2026-10-25T00:30Z"]
    assert next_due(at_0230, utc(2026, 10, 25, 1, 10), BERLIN) == utc(2026, 10, 26, 1, 30)


def test_slot_key_and_payload_as_the_ticker_enqueues_them() -> None:
    spec = Schedule("poll", cron="*/5 * * * *", payload={"a": 1})
    (job,) = due_jobs([spec], utc(2026, 11, 29, 14, 7), UTC)
    assert job.payload == {"a": 1, "slot": "2026-11-29T14:05Z"}
    assert job.key == "poll:2026-11-29T14:05Z"


@pytest.mark.parametrize("expr", ["", "* * * *", "0 0 * * * *", "61 * * * *", "0 0 30 2 *", "@daily", "x y z w v"])
def test_invalid_cron_raises_value_error(expr: str) -> None:
    with pytest.raises(ValueError, match="cron"):
        Schedule("x", cron=expr)


def test_cron_with_another_spec_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Schedule("x", every_minutes=5, cron="* * * * *")
