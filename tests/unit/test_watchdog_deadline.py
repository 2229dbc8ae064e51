"""When a heartbeat counts as silent: two of its schedule's slots after the last beat."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from autom.schedule import Schedule
from autom.watchdog import heartbeat_deadline, heartbeat_schedule

BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_an_interval_heartbeat_is_silent_after_two_periods() -> None:
    spec = Schedule("heartbeat", every_minutes=60)
    assert heartbeat_deadline(spec, at("2026-12-03T10:00:05+00:00"), None) == at("2026-12-03T12:00:05+00:00")


def test_a_weekday_cron_beat_on_friday_is_not_missed_over_the_weekend() -> None:
    spec = Schedule("heartbeat", cron="0 9 * * 1-5")
    friday = at("2026-12-04T09:00:10+01:00")  # a Friday, Berlin
    deadline = heartbeat_deadline(spec, friday, BERLIN)
    # Monday 09:00 is the next slot, Tuesday 09:00 the second: silent only after that
    assert datetime.fromtimestamp(deadline, BERLIN) == datetime(2026, 12, 8, 9, 0, tzinfo=BERLIN)


def test_a_cron_every_five_minutes_is_missed_after_about_ten_not_after_days() -> None:
    spec = Schedule("heartbeat", cron="*/5 * * * *")
    last = at("2026-12-03T10:00:20+00:00")
    assert heartbeat_deadline(spec, last, UTC) == at("2026-12-03T10:10:00+00:00")


def test_a_daily_heartbeat_is_silent_at_its_second_day() -> None:
    spec = Schedule("heartbeat", daily_at="09:00")
    last = at("2026-12-03T09:00:03+01:00")
    assert datetime.fromtimestamp(heartbeat_deadline(spec, last, BERLIN), BERLIN) == \
        datetime(2026, 12, 5, 9, 0, tzinfo=BERLIN)


def test_the_heartbeat_schedule_is_found_by_its_kind() -> None:
    beat = Schedule("heartbeat", cron="0 * * * *")
    assert heartbeat_schedule([Schedule("report", every_minutes=5), beat]) is beat
    assert heartbeat_schedule([Schedule("report", every_minutes=5)]) is None
