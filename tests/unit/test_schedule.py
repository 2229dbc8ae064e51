"""autom.schedule: slots of interval and daily specs, with explicit `now` (no sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from autom.schedule import DEFAULT_SCHEDULES, Schedule, job_key, next_due, slot

BERLIN = ZoneInfo("Europe/Berlin")
AUCKLAND = ZoneInfo("Pacific/Auckland")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


# -- interval specs --------------------------------------------------------------------


def test_hourly_slot_is_the_start_of_the_hour() -> None:
    hourly = Schedule("heartbeat", every_minutes=60)
    assert slot(hourly, utc(2026, 11, 29, 14, 0, 0), None) == "2026-11-29T14:00Z"
    assert slot(hourly, utc(2026, 11, 29, 14, 59, 59), None) == "2026-11-29T14:00Z"
    assert slot(hourly, utc(2026, 11, 29, 15, 0, 0), None) == "2026-11-29T15:00Z"
    assert job_key(hourly, "2026-11-29T14:00Z") == "heartbeat:2026-11-29T14:00Z"


def test_interval_slots_are_utc_whatever_the_zone_of_now() -> None:
    hourly = Schedule("heartbeat", every_minutes=60)
    local = datetime(2026, 11, 29, 15, 30, tzinfo=BERLIN)  # 14:30 UTC
    assert slot(hourly, local, BERLIN) == "2026-11-29T14:00Z"
    # a zone half an hour off UTC does not shift the boundaries
    india = datetime(2026, 11, 29, 20, 10, tzinfo=ZoneInfo("Asia/Kolkata"))  # 14:40 UTC
    assert slot(hourly, india, None) == "2026-11-29T14:00Z"


def test_every_15_minutes() -> None:
    spec = Schedule("poll", every_minutes=15)
    assert slot(spec, utc(2026, 11, 29, 14, 0), None) == "2026-11-29T14:00Z"
    assert slot(spec, utc(2026, 11, 29, 14, 14, 59), None) == "2026-11-29T14:00Z"
    assert slot(spec, utc(2026, 11, 29, 14, 15), None) == "2026-11-29T14:15Z"
    assert slot(spec, utc(2026, 11, 29, 14, 44), None) == "2026-11-29T14:30Z"
    assert slot(spec, utc(2026, 11, 29, 23, 59, 59), None) == "2026-11-29T23:45Z"
    assert next_due(spec, utc(2026, 11, 29, 14, 44), None) == utc(2026, 11, 29, 14, 45)


def test_every_90_minutes_lands_on_the_same_times_each_day() -> None:
    spec = Schedule("report", every_minutes=90)
    assert slot(spec, utc(2026, 11, 29, 0, 0), None) == "2026-11-29T00:00Z"
    assert slot(spec, utc(2026, 11, 29, 1, 29), None) == "2026-11-29T00:00Z"
    assert slot(spec, utc(2026, 11, 29, 1, 30), None) == "2026-11-29T01:30Z"
    assert slot(spec, utc(2026, 11, 30, 2, 59), None) == "2026-11-30T01:30Z"


def test_every_100_minutes_is_evenly_spaced_from_the_epoch() -> None:
    spec = Schedule("odd", every_minutes=100)
    # 2026-11-29T00:00Z is epoch minute 29_931_840 = 100 * 299_318 + 40: the slot began 40 min earlier
    assert slot(spec, utc(2026, 11, 29, 0, 0), None) == "2026-11-28T23:20Z"
    # slot starts drift from day to day (1440 % 100 == 40) but stay exactly 100 min apart
    assert slot(spec, utc(2026, 11, 30, 0, 19), None) == "2026-11-29T22:40Z"
    assert slot(spec, utc(2026, 11, 30, 0, 20), None) == "2026-11-30T00:20Z"
    assert next_due(spec, utc(2026, 11, 30, 0, 20), None) == utc(2026, 11, 30, 2, 0)


def test_every_minute_and_seconds_do_not_matter() -> None:
    spec = Schedule("tick", every_minutes=1)
    assert slot(spec, utc(2026, 11, 29, 14, 7, 59, 999999), None) == "2026-11-29T14:07Z"


def test_missed_slot_still_runs_later_in_its_period() -> None:
    # the service was down at 14:00 and comes back at 14:47: the 14:00 slot is the one due
    hourly = Schedule("heartbeat", every_minutes=60)
    assert slot(hourly, utc(2026, 11, 29, 14, 47), None) == "2026-11-29T14:00Z"


def test_default_schedules_are_an_hourly_heartbeat() -> None:
    assert (Schedule("heartbeat", every_minutes=60),) == DEFAULT_SCHEDULES


# -- daily specs -----------------------------------------------------------------------


def test_daily_before_and_after_its_time() -> None:
    spec = Schedule("digest", daily_at="09:30")
    assert slot(spec, datetime(2026, 11, 29, 9, 29, 59, tzinfo=BERLIN), BERLIN) is None
    assert slot(spec, datetime(2026, 11, 29, 9, 30, tzinfo=BERLIN), BERLIN) == "2026-11-29"
    assert slot(spec, datetime(2026, 11, 29, 23, 59, tzinfo=BERLIN), BERLIN) == "2026-11-29"
    assert slot(spec, datetime(2026, 11, 30, 0, 0, tzinfo=BERLIN), BERLIN) is None
    assert job_key(spec, "2026-11-29") == "digest:2026-11-29"


def test_daily_uses_the_local_time_of_tz_not_of_now() -> None:
    spec = Schedule("digest", daily_at="09:30")
    # 08:45 UTC is 09:45 in Berlin (winter): due there, not in UTC
    now = utc(2026, 11, 29, 8, 45)
    assert slot(spec, now, BERLIN) == "2026-11-29"
    assert slot(spec, now, ZoneInfo("UTC")) is None
    assert next_due(spec, utc(2026, 11, 29, 8, 0), BERLIN) == datetime(2026, 11, 29, 9, 30, tzinfo=BERLIN)
    assert next_due(spec, now, BERLIN) == datetime(2026, 11, 30, 9, 30, tzinfo=BERLIN)


def test_daily_midnight() -> None:
    spec = Schedule("prune", daily_at="00:00")
    assert slot(spec, datetime(2026, 11, 29, 0, 0, tzinfo=BERLIN), BERLIN) == "2026-11-29"
    assert slot(spec, datetime(2026, 11, 28, 23, 59, tzinfo=BERLIN), BERLIN) == "2026-11-28"


def test_spring_forward_nonexistent_time_is_due_at_the_next_existing_minute() -> None:
    # Europe/Berlin 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist
    spec = Schedule("nightly", daily_at="02:30")
    just_before = utc(2026, 3, 29, 0, 59)  # 01:59 CET
    jump = utc(2026, 3, 29, 1, 0)  # 03:00 CEST
    assert slot(spec, just_before, BERLIN) is None
    assert slot(spec, jump, BERLIN) == "2026-03-29"
    assert slot(spec, jump + timedelta(hours=5), BERLIN) == "2026-03-29"
    assert next_due(spec, just_before, BERLIN) == jump
    assert next_due(spec, just_before, BERLIN).astimezone(BERLIN).strftime("%H:%M") == "03:00"
    # the day after, 02:30 exists again (CEST = UTC+2)
    assert next_due(spec, jump, BERLIN) == utc(2026, 3, 30, 0, 30)


def test_fall_back_repeated_time_makes_one_slot() -> None:
    # Europe/Berlin 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice
    spec = Schedule("nightly", daily_at="02:30")
    first = utc(2026, 10, 25, 0, 30)  # 02:30 CEST
    second = utc(2026, 10, 25, 1, 30)  # 02:30 CET
    assert slot(spec, first - timedelta(seconds=1), BERLIN) is None
    keys = {slot(spec, first + timedelta(minutes=m), BERLIN) for m in range(0, 22 * 60 + 30, 7)}
    assert keys == {"2026-10-25"}  # the local day is 25 h long: 22 h 30 min left after 02:30 CEST
    assert slot(spec, utc(2026, 10, 25, 23, 0), BERLIN) is None  # midnight CET: the 26th
    assert slot(spec, second, BERLIN) == "2026-10-25"
    assert next_due(spec, first - timedelta(minutes=1), BERLIN) == first
    assert next_due(spec, first, BERLIN) == utc(2026, 10, 26, 1, 30)  # 02:30 CET the next day


def test_one_key_per_local_day_across_a_dst_week() -> None:
    spec = Schedule("nightly", daily_at="02:30")
    keys = []
    now = utc(2026, 3, 26, 0, 0)
    while now < utc(2026, 4, 2, 0, 0):
        key = slot(spec, now, BERLIN)
        if key is not None and (not keys or keys[-1] != key):
            keys.append(key)
        now += timedelta(minutes=10)
    assert keys == [f"2026-03-{d:02d}" for d in range(26, 32)] + ["2026-04-01"]


def test_date_boundary_far_from_utc() -> None:
    # Pacific/Auckland is UTC+13 in (southern) summer: its 29 November starts at 11:00 UTC on the 28th
    spec = Schedule("morning", daily_at="07:00")
    assert slot(spec, utc(2026, 11, 28, 17, 59), AUCKLAND) is None  # 06:59 on the 29th there
    assert slot(spec, utc(2026, 11, 28, 18, 0), AUCKLAND) == "2026-11-29"  # 07:00 on the 29th
    assert slot(spec, utc(2026, 11, 29, 10, 59), AUCKLAND) == "2026-11-29"  # 23:59 on the 29th
    assert slot(spec, utc(2026, 11, 29, 11, 0), AUCKLAND) is None  # 00:00 on the 30th
    assert next_due(spec, utc(2026, 11, 29, 11, 0), AUCKLAND) == datetime(2026, 11, 30, 7, 0, tzinfo=AUCKLAND)


def test_a_gap_past_midnight_moves_the_slot_to_the_next_date() -> None:
    # Samoa skipped 30 December 2011 (23:59:59 on the 29th, UTC-10, was followed by 00:00
    # on the 31st, UTC+14). The 30th's noon did not exist: the next minute that did is
    # 00:00 on the 31st, so the 30th's slot is due from then until the 31st's own noon.
    apia = ZoneInfo("Pacific/Apia")
    spec = Schedule("noon", daily_at="12:00")
    assert slot(spec, datetime(2011, 12, 29, 23, 59, tzinfo=apia), apia) == "2011-12-29"
    start_of_31st = datetime(2011, 12, 31, 0, 0, tzinfo=apia)
    assert slot(spec, start_of_31st, apia) == "2011-12-30"
    assert slot(spec, datetime(2011, 12, 31, 11, 59, tzinfo=apia), apia) == "2011-12-30"
    assert slot(spec, datetime(2011, 12, 31, 12, 0, tzinfo=apia), apia) == "2011-12-31"
    assert next_due(spec, datetime(2011, 12, 29, 23, 0, tzinfo=apia), apia) == start_of_31st


def test_daily_with_no_tz_uses_the_process_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    from autom import schedule

    monkeypatch.setattr(schedule, "process_zone", lambda: AUCKLAND)
    spec = Schedule("morning", daily_at="07:00")
    assert slot(spec, utc(2026, 11, 28, 18, 0), None) == "2026-11-29"


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"every_minutes": 60, "daily_at": "09:00"},
        {"every_minutes": 0},
        {"every_minutes": -5},
        {"every_minutes": 1.5},
        {"every_minutes": True},
        {"daily_at": "24:00"},
        {"daily_at": "12:60"},
        {"daily_at": "9:30"},
        {"daily_at": "09:30:00"},
        {"daily_at": "noon"},
        {"daily_at": ""},
    ],
)
def test_invalid_specs_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Schedule("x", **kwargs)  # type: ignore[arg-type]


def test_valid_edges() -> None:
    Schedule("x", daily_at="00:00")
    Schedule("x", daily_at="23:59")
    Schedule("x", every_minutes=1)
    Schedule("x", every_minutes=2880)


def test_empty_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        Schedule("", every_minutes=5)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError):
        slot(Schedule("x", every_minutes=5), datetime(2026, 11, 29, 14, 0), None)


def test_specs_are_hashable_and_payload_is_kept() -> None:
    spec = Schedule("x", every_minutes=5, payload={"a": 1})
    assert spec.payload == {"a": 1}
    assert len({spec, Schedule("x", every_minutes=5, payload={"a": 1})}) == 1
