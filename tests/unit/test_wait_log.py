"""``WaitLog``: waits for Telegram's limits logged at most once a minute per reason (autom/limits.py)."""

from __future__ import annotations

from autom.limits import WaitLog


def test_the_first_wait_of_a_reason_is_logged_then_one_line_a_minute_counts_the_rest() -> None:
    waits = WaitLog(every=60.0)
    assert waits.note("chat", 0.0) == 1
    assert [waits.note("chat", t) for t in (1.0, 30.0, 59.0)] == [None, None, None]
    assert waits.note("global", 5.0) == 1  # each reason on its own
    assert waits.note("chat", 60.0) == 4  # the three counted since, and this one
    assert waits.note("chat", 61.0) is None
    assert waits.note("chat", 200.0) == 2
