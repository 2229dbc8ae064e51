"""AlertThrottle (pure, time passed in) and how TelegramClient applies it; no sleeping, no network."""

from __future__ import annotations

import pytest

from autom.config import Settings
from autom.telegram import AlertThrottle, TelegramClient


def test_allows_limit_alerts_per_window_then_counts() -> None:
    throttle = AlertThrottle(limit=5, window=60)
    assert [throttle.admit(float(t)) for t in range(5)] == [True] * 5
    assert throttle.admit(5.0) is False
    assert throttle.admit(6.0) is False
    assert throttle.suppressed == 2
    assert throttle.take_summary(30.0) is None  # the window is still full


def test_summary_once_the_window_has_room() -> None:
    throttle = AlertThrottle(limit=5, window=60)
    for t in range(5):
        throttle.admit(float(t))
    for t in range(10, 17):
        throttle.admit(float(t))
    assert throttle.take_summary(59.9) is None
    summary = throttle.take_summary(60.0)  # the alert sent at 0 has left the window
    assert summary == "7 more alerts suppressed in the last minute; see `autom failed`"
    assert throttle.suppressed == 0
    assert throttle.take_summary(61.0) is None  # one summary, not one per flush


def test_summary_takes_a_slot_and_new_alerts_wait_behind_a_pending_summary() -> None:
    throttle = AlertThrottle(limit=2, window=10)
    assert throttle.admit(0.0) and throttle.admit(1.0)
    assert not throttle.admit(2.0)
    # at 10.5 there is room for one: an alert that bypassed the summary would hide the count,
    # so admit() refuses while a summary is pending (the client flushes before admitting)
    assert not throttle.admit(10.5)
    assert throttle.take_summary(10.5) == "2 more alerts suppressed in the last 10 s; see `autom failed`"
    # the summary used the free slot: the alert sent at 1.0 still fills the other
    assert not throttle.admit(10.6)
    assert throttle.take_summary(11.0) == "1 more alert suppressed in the last 10 s; see `autom failed`"
    assert throttle.admit(20.5)  # 10.5 has left the window; 11.0 is still in it


def test_rolling_window_not_fixed_buckets() -> None:
    throttle = AlertThrottle(limit=3, window=60)
    assert throttle.admit(50.0) and throttle.admit(55.0) and throttle.admit(59.0)
    # a fixed per-minute bucket would allow 3 more at 61; a rolling window does not
    assert not throttle.admit(61.0)
    assert throttle.take_summary(110.0) == "1 more alert suppressed in the last minute; see `autom failed`"
    assert throttle.admit(115.5)
    assert not throttle.admit(116.0)  # 59, 110, 115.5 are in the window


def test_a_quiet_throttle_never_summarises() -> None:
    throttle = AlertThrottle()
    assert throttle.take_summary(0.0) is None
    assert all(throttle.admit(t * 20.0) for t in range(100))  # 3 a minute, under the limit
    assert throttle.take_summary(10_000.0) is None


@pytest.mark.parametrize(("limit", "window"), [(0, 60), (5, 0), (5, -1)])
def test_bad_parameters(limit: int, window: float) -> None:
    with pytest.raises(ValueError):
        AlertThrottle(limit=limit, window=window)


class RecordingClient(TelegramClient):
    """Log-only client whose alerts are recorded instead of logged."""

    def __init__(self, throttle: AlertThrottle) -> None:
        super().__init__(Settings(telegram_alert_chat_id="-100"), log_only=True, throttle=throttle)
        self.sent: list[str] = []

    async def alert(self, text: str) -> bool:
        self.sent.append(text)
        return True


async def test_client_applies_the_throttle_and_flushes_the_summary() -> None:
    client = RecordingClient(AlertThrottle(limit=2, window=60))
    assert await client.alert_throttled("a", now=0.0)
    assert await client.alert_throttled("b", now=1.0)
    assert not await client.alert_throttled("c", now=2.0)
    assert not await client.alert_throttled("d", now=3.0)
    assert client.sent == ["a", "b"]
    # the storm is over: the periodic flush sends the summary when the window allows
    assert not await client.flush_summary(now=30.0)
    assert await client.flush_summary(now=60.0)
    assert client.sent[-1] == "2 more alerts suppressed in the last minute; see `autom failed`"
    # a new alert after that: room for one more (the summary used the slot of "a")
    assert await client.alert_throttled("e", now=61.5)
    assert client.sent == ["a", "b", client.sent[2], "e"]


async def test_summary_goes_out_before_the_next_alert() -> None:
    client = RecordingClient(AlertThrottle(limit=1, window=60))
    assert await client.alert_throttled("a", now=0.0)
    assert not await client.alert_throttled("b", now=1.0)
    # at 70 there is room for one message: the summary takes it, "c" is counted for the next one
    assert not await client.alert_throttled("c", now=70.0)
    assert client.sent == ["a", "1 more alert suppressed in the last minute; see `autom failed`"]
    assert client.throttle.suppressed == 1


async def test_alert_job_failed_names_id_kind_attempts_and_error() -> None:
    client = RecordingClient(AlertThrottle())
    assert await client.alert_job_failed(42, "telegram.message", 8, "telegram sendMessage: HTTP 400 chat not found")
    assert client.sent == [
        "autom: job 42 (telegram.message) failed after 8 attempts: telegram sendMessage: HTTP 400 chat not found"
    ]
    await client.alert_job_failed(43, "site.form", 1, ValueError("bad\npayload"))
    assert client.sent[-1] == "autom: job 43 (site.form) failed after 1 attempt: bad payload"


def test_force_takes_the_summary_even_when_the_window_is_full():
    throttle = AlertThrottle(limit=2, window=60)
    assert throttle.admit(0) and throttle.admit(1)
    assert not throttle.admit(2) and not throttle.admit(3)
    assert throttle.take_summary(4) is None  # no room yet
    summary = throttle.take_summary(4, force=True)  # shutdown: report what is held
    assert summary is not None and summary.startswith("2 more alerts suppressed")
    assert throttle.take_summary(5, force=True) is None  # nothing left
