"""What the console shows, computed without a browser or a database (autom.web.console.present, autom.ops)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autom.ops import Capped, error_headline
from autom.web.console.present import (
    MAX_SHOWN,
    age,
    body_as_json,
    count_table,
    cut,
    pretty_json,
    throughput_chart,
    when,
)
from autom.web.params import BadParameter, ident, limit, parse_query, parse_time, status, text

NOW = datetime(2026, 12, 1, 10, 30, 40, tzinfo=UTC)


@pytest.mark.parametrize(("stored", "shown"), [
    ("PermanentError: telegram sendMessage: HTTP 400 Bad Request: chat not found",
     "Bad Request: chat not found (PermanentError: telegram sendMessage: HTTP 400)"),
    ("PermanentError: telegram sendMessage: HTTP 403 ok=false Forbidden: bot was blocked by the user",
     "Forbidden: bot was blocked by the user (PermanentError: telegram sendMessage: HTTP 403)"),
    ("RuntimeError: the CRM said no\nsecond line", "RuntimeError: the CRM said no second line"),
    ("TransientError: telegram sendMessage: timed out (ReadTimeout)",
     "TransientError: telegram sendMessage: timed out (ReadTimeout)"),
    (None, ""),
])
def test_error_headline_puts_the_apis_description_first(stored: str | None, shown: str) -> None:
    assert error_headline(stored) == shown


def test_capped_counts_never_claim_more_than_they_know() -> None:
    assert str(Capped(999, 1000)) == "999"
    assert str(Capped(1000, 1000)) == "1,000+"
    table = count_table({"a": {"done": Capped(1000, 1000), "failed": Capped(3, 1000)},
                         "b": {"done": Capped(5, 1000)}})
    assert table.kinds[0] == ("a", ["0", "0", "1,000+", "3", "0"])
    assert table.totals == ["0", "0", "1,005+", "3", "0"]


def test_a_count_past_its_cap_says_the_planners_estimate_as_about() -> None:
    assert str(Capped(1000, 1000, 943_512)) == "about 940,000"
    assert str(Capped(1000, 1000, 45_027)) == "about 45,000"
    assert str(Capped(1000, 1000, 800)) == "1,000+"  # the planner expects fewer than were counted
    assert str(Capped(12, 1000, 5000)) == "12"  # exact below the cap, whatever the planner thinks
    table = count_table({"a": {"done": Capped(1000, 1000, 943_512), "failed": Capped(3, 1000)},
                         "b": {"done": Capped(5, 1000), "failed": Capped(1000, 1000, 45_027)},
                         "c": {"failed": Capped(1000, 1000)}})
    assert table.kinds[0] == ("a", ["0", "0", "about 940,000", "3", "0"])
    assert table.totals == ["0", "0", "about 940,000", "46,030+", "0"]


def test_throughput_chart_places_minutes_and_scales_to_the_peak() -> None:
    minute = NOW.replace(second=0)
    rows = [
        {"minute": minute, "status": "done", "n": 10},
        {"minute": minute, "status": "failed", "n": 1},
        {"minute": minute - timedelta(minutes=59), "status": "done", "n": 5},
        {"minute": minute - timedelta(minutes=60), "status": "done", "n": 99},  # outside the hour
    ]
    chart = throughput_chart(rows, NOW, width=600, height=100)
    assert (chart.peak, chart.done, chart.failed) == (10, 15, 1)
    by = {(b.status, round(b.x)): b for b in chart.bars}
    assert by[("done", 590)].height == 100 and by[("done", 590)].y == 0
    assert by[("failed", 595)].height == 10
    assert by[("done", 0)].height == 50
    assert len(chart.bars) == 3
    assert throughput_chart([], NOW).bars == []


def test_text_helpers() -> None:
    assert pretty_json({"b": 1, "a": "<x>"}) == '{\n  "a": "<x>",\n  "b": 1\n}'
    assert body_as_json("not json") is None and body_as_json('{"a":1}') == '{\n  "a": 1\n}'
    long = "x" * (MAX_SHOWN + 5)
    assert cut(long).endswith("(5 more characters not shown)")
    assert [age(s) for s in (5, 300, 4000, 90000)] == ["5 s", "5 min", "1 h 6 min", "1 d 1 h"]
    assert when("2026-12-01T11:30:05+01:00") == "2026-12-01 10:30:05"
    assert when(None) == "—"


def test_query_parameters_are_checked_and_named() -> None:
    spec = {"status": status, "kind": text, "before": ident, "limit": limit(200)}
    assert parse_query([("status", "failed"), ("kind", "")], spec) == {
        "status": "failed", "kind": None, "before": None, "limit": None}
    for items, named in (([("colour", "red")], "colour"), ([("kind", "a"), ("kind", "b")], "kind"),
                         ([("limit", "201")], "limit"), ([("before", "0")], "before"),
                         ([("status", "FAILED")], "status"), ([("kind", "a\x00b")], "kind")):
        with pytest.raises(BadParameter, match=named):
            parse_query(items, spec)


def test_times_are_iso_or_an_age() -> None:
    assert parse_time("6h", NOW) == NOW - timedelta(hours=6)
    assert parse_time("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_time("2026-12-01T09:00:00Z", NOW) == datetime(2026, 12, 1, 9, tzinfo=UTC)
    assert parse_time("2026-12-01", NOW) == datetime(2026, 12, 1, tzinfo=UTC)  # no zone = UTC
    for bad in ("yesterday", "6 hours", "-5m", "2026-13-01"):
        with pytest.raises(ValueError, match="ISO 8601"):
            parse_time(bad, NOW)


def test_visible_escapes_what_would_act_on_the_screen_and_keeps_the_rest() -> None:
    from autom.ops import visible

    assert visible("a\x1b[2Jb\u202ec\ud800d\x9b\u2066e\u200ff") == "a\\x1b[2Jb\\u202ec\\ud800d\\x9b\\u2066e\\u200ff"
    kept = "tab\tnew\nline\r é ü 😀 👨\u200d👩 שלום مرحبا"
    assert visible(kept) == kept
    assert visible("a\tb\nc", one_line=True) == "a\\x09b\\x0ac"


def test_log_throttle_lets_one_line_a_second_per_key_through_and_counts_the_rest() -> None:
    from autom.web.lockout import LogThrottle

    throttle = LogThrottle(every=1.0, max_keys=2)
    assert throttle.allow("a", 100.0) == 0
    assert throttle.allow("a", 100.5) is None and throttle.allow("a", 100.9) is None
    assert throttle.allow("b", 100.9) == 0  # another key is not held back
    assert throttle.allow("a", 101.0) == 2  # two lines skipped meanwhile
    assert throttle.allow("c", 105.0) == 0  # past max_keys: the quiet keys are forgotten
    assert throttle.allow("a", 105.1) == 0
