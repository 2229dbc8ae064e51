"""AlertThrottle (pure, time passed in), the alert texts and the bell; no sleeping, no network.

The sender that applies them to the outbox is tested against a real database in
tests/integration/test_alert_outbox.py.
"""

from __future__ import annotations

import re

import pytest

from autom.alerts import MAX_BACKOFF_SECONDS, AlertThrottle, backoff, job_failed_text, summary_text
from autom.bells import AlertBell


def test_room_for_limit_delivered_alerts_per_rolling_window() -> None:
    throttle = AlertThrottle(limit=3, window=60)
    for t in (50.0, 55.0, 59.0):
        assert throttle.has_room(t)
        throttle.sent(t)
    # a fixed per-minute bucket would have room at 61; a rolling window has not
    assert not throttle.has_room(61.0)
    assert not throttle.has_room(109.9)
    assert throttle.has_room(110.0)  # the one sent at 50 has left the window


def test_a_failed_delivery_takes_no_slot() -> None:
    # the sender only records what Telegram accepted: retrying one alert five times
    # must not turn it into a summary of itself
    throttle = AlertThrottle(limit=1, window=60)
    assert all(throttle.has_room(float(t)) for t in range(10))
    throttle.sent(10.0)
    assert not throttle.has_room(11.0)


def test_summary_gathers_then_at_most_one_per_window() -> None:
    throttle = AlertThrottle(limit=5, window=60, gather=5)
    # first held at 3: the summary waits 5 s for the rest of the burst
    assert throttle.summary_at(3.0) == 8.0
    throttle.summarised(8.0)
    # the next summary: not within a window of the last one
    assert throttle.summary_at(20.0) == 68.0
    assert throttle.summary_at(100.0) == 105.0


@pytest.mark.parametrize(("limit", "window", "gather"), [(0, 60, 5), (5, 0, 5), (5, -1, 5), (5, 60, -1)])
def test_bad_parameters(limit: int, window: float, gather: float) -> None:
    with pytest.raises(ValueError):
        AlertThrottle(limit=limit, window=window, gather=gather)


def test_job_failed_text_names_id_kind_attempts_and_error() -> None:
    assert job_failed_text(42, "telegram.message", 8, "telegram sendMessage: HTTP 400 chat not found") == (
        "autom: job 42 (telegram.message) failed after 8 attempts: telegram sendMessage: HTTP 400 chat not found"
    )
    assert job_failed_text(43, "site.form", 1, ValueError("bad\npayload")) == (
        "autom: job 43 (site.form) failed after 1 attempt: bad payload"
    )


def _rows(kinds: dict[str, int], first: int = 1) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for kind, n in kinds.items():
        rows += [{"job_id": first + len(rows) + i, "kind": kind} for i in range(n)]
    return rows


def test_summary_says_how_many_of_which_kinds_names_them_and_where_to_see_them() -> None:
    text = summary_text(_rows({"telegram.message": 40, "site.form": 5}))
    assert text.startswith("autom: 45 jobs failed for good, too many at once for one alert each "
                           "(telegram.message: 40, site.form: 5): jobs 1, 2, 3, ")
    assert text.endswith(", 44, 45. All of them: the console's /ui/jobs?status=failed (or `autom failed --limit 45`)")
    small = summary_text(_rows({"github.event": 2}, first=7))
    assert "jobs 7, 8. " in small and "`autom failed --limit 20`" in small
    many = summary_text(_rows({f"kind.{n}": n + 1 for n in range(15)}))
    assert many.count("kind.") == 10 and ", …)" in many


def test_a_summary_of_more_ids_than_fit_names_the_first_and_counts_the_rest() -> None:
    text = summary_text(_rows({"k": 2000}, first=100000))
    assert len(text) <= 3500
    named = [int(n) for n in re.findall(r"\b1\d{5}\b", text)]
    assert named == list(range(100000, 100000 + len(named))) and len(named) > 300
    assert f"… and {2000 - len(named)} more. All of them: the console's /ui/jobs?status=failed" in text


def test_bell_collects_ids_until_taken() -> None:
    bell = AlertBell()
    seen = bell.doorbell.count
    bell.ring(7)
    bell.ring(3)
    bell.ring(7)
    assert bell.doorbell.count > seen
    assert bell.take() == [3, 7]
    assert bell.take() == []


def test_backoff_doubles_to_a_ceiling() -> None:
    assert [backoff(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff(10) == backoff(10**6) == MAX_BACKOFF_SECONDS
