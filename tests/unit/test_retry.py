"""The backoff: grows exponentially, jitters ±20 %, never exceeds the cap."""

from __future__ import annotations

import random

import pytest

from autom.errors import PermanentError, Retry, TransientError
from autom.jobs.retry import MAX_ERROR, RETRY_AFTER_CEILING, RetryPolicy, describe, error_text, is_final


def test_delay_doubles_per_attempt_without_jitter():
    policy = RetryPolicy(base=10, cap=3600)
    mid = [policy.delay(n, rand=lambda: 0.5) for n in range(1, 8)]
    assert mid == [10, 20, 40, 80, 160, 320, 640]


@pytest.mark.parametrize("attempt", range(1, 40))
def test_jitter_bounds_and_cap(attempt):
    policy = RetryPolicy(base=10, cap=3600)
    raw = min(3600, 10 * 2 ** (attempt - 1))
    low = policy.delay(attempt, rand=lambda: 0.0)
    high = policy.delay(attempt, rand=lambda: 0.999999)
    assert low == pytest.approx(raw * 0.8)
    assert high <= 3600
    assert high == pytest.approx(min(3600, raw * 1.2), rel=1e-5)
    rng = random.Random(attempt)
    for _ in range(200):
        d = policy.delay(attempt, rand=rng.random)
        assert raw * 0.8 <= d <= min(3600, raw * 1.2)


def test_delay_never_decreases_in_expectation_and_survives_huge_attempts():
    policy = RetryPolicy(base=10, cap=3600)
    mids = [policy.delay(n, rand=lambda: 0.5) for n in range(1, 200)]
    assert mids == sorted(mids)
    assert policy.delay(10**6) <= 3600


def test_retry_after_sets_a_floor():
    policy = RetryPolicy(base=1, cap=10)
    assert policy.delay_for(Retry("429", after=42), 1, rand=lambda: 0.5) == 42
    assert policy.delay_for(Retry("429", after=0.1), 3, rand=lambda: 0.5) == 4


@pytest.mark.parametrize("after", [999_999, 10**9, float("inf"), 1e308])
def test_retry_after_is_capped_at_the_ceiling(after):
    # Retry-After: 999999 must not push a job 11 days away: an hour at most by default
    policy = RetryPolicy(base=1, cap=10)
    assert policy.delay_for(Retry("429", after=after), 1, rand=lambda: 0.5) == RETRY_AFTER_CEILING == 3600


def test_retry_after_ceiling_follows_a_longer_cap_and_can_be_set():
    assert RetryPolicy(base=1, cap=7200).delay_for(Retry("429", after=10**6), 1, rand=lambda: 0.5) == 7200
    short = RetryPolicy(base=1, cap=10, after_ceiling=60)
    assert short.delay_for(Retry("429", after=999_999), 1, rand=lambda: 0.5) == 60
    # within the ceiling the floor still holds
    assert short.delay_for(Retry("429", after=59), 1, rand=lambda: 0.5) == 59


def test_retry_after_that_is_no_number_of_seconds_is_no_floor():
    policy = RetryPolicy(base=1, cap=10)
    nan = Retry("429", after=0)
    nan.after = float("nan")  # Retry clamps what it is given; a caller could still set it
    assert policy.delay_for(nan, 2, rand=lambda: 0.5) == 2
    negative = Retry("429", after=0)
    negative.after = -50.0
    assert policy.delay_for(negative, 2, rand=lambda: 0.5) == 2


def test_final_when_permanent_or_out_of_attempts():
    assert is_final(PermanentError("400"), 1, 8)
    assert not is_final(TransientError("502"), 7, 8)
    assert is_final(TransientError("502"), 8, 8)
    assert not is_final(RuntimeError("bug"), 1, 8)


def test_describe_is_one_line_and_bounded():
    assert describe(RuntimeError("a\nb")) == "RuntimeError: a b"
    assert describe(ValueError()) == "ValueError"
    assert len(describe("x" * 5000, limit=100)) == 100


def test_a_stored_error_keeps_its_lines_bounded():
    sql = 'syntax error at or near "form"\r\nLINE 1: select * form jobs\n                 ^\n\n\n\nHINT:  a typo?  \n\n'
    assert error_text(RuntimeError(sql)) == ('RuntimeError: syntax error at or near "form"\n'
                                             'LINE 1: select * form jobs\n                 ^\n\nHINT:  a typo?')
    assert error_text(ValueError()) == "ValueError" and error_text(ValueError("\n")) == "ValueError"
    assert error_text("a\x00b") == "a\ufffdb"
    many = error_text("\n".join(f"line {i}" for i in range(200)), max_lines=10)
    assert many.splitlines() == [*(f"line {i}" for i in range(9)), "… (191 more lines)"]
    long = error_text("x" * (MAX_ERROR * 2))
    assert len(long) == MAX_ERROR and long.endswith("…")
