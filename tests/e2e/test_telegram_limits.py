"""Telegram's limits in the real ``autom run`` against the Telegram stub (README, "Telegram's limits").

Waiting for a limit is a deferral, not a failure: each job below ends ``done`` with
``attempts = 1``. Times are the stub's arrival times; only lower bounds on spacing are
asserted (a slow machine spaces sends further apart, never closer).
"""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.processes import autom_processes
from tests.support.service import ALERT_CHAT, TG_SECRET, post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import Reply, TelegramStub


async def _done(db: Any, n: int) -> bool:
    return int(await db.fetch_val("select count(*) from jobs where kind = 'telegram.message' and status = 'done'")) >= n


async def test_a_chats_quick_pongs_are_spaced_by_its_rate_and_each_takes_one_attempt(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, TELEGRAM_CHAT_RATE="2")
        async with httpx.AsyncClient(base_url=proc.url) as client:
            for update_id in range(1, 6):
                assert (await post_telegram(client, telegram_update(update_id, 42, "/ping"))).status_code == 202
        with trio.fail_after(30):
            calls = await telegram_stub.wait_for_calls(5, method="sendMessage", chat_id=42)
        await wait_until(lambda: _done(db, 5), timeout=10)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    assert [c.params["text"] for c in calls] == ["pong"] * 5
    gaps = [b.time - a.time for a, b in itertools.pairwise(calls)]
    assert calls[-1].time - calls[0].time >= 4 * 0.5 - 0.3, gaps  # 2 a second, no burst
    attempts = await db.fetch_all("select attempts, status from jobs where kind = 'telegram.message'")
    assert attempts == [{"attempts": 1, "status": "done"}] * 5


async def test_a_429_with_retry_after_pauses_that_chat_only(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    telegram_stub.plan("sendMessage", [Reply(status=429, retry_after=3)], chat_id=42)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url)
        async with httpx.AsyncClient(base_url=proc.url) as client:
            await post_telegram(client, telegram_update(1, 42, "/ping"))
            with trio.fail_after(15):
                refused = (await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=42))[0]
            await post_telegram(client, telegram_update(2, 43, "/ping"))
            with trio.fail_after(15):
                other = (await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=43))[0]
            with trio.fail_after(20):
                calls = await telegram_stub.wait_for_calls(2, method="sendMessage", chat_id=42)
        await wait_until(lambda: _done(db, 2), timeout=10)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    assert other.time - refused.time < 3  # chat 43 did not wait for chat 42's pause
    assert calls[1].time - refused.time >= 3 - 0.3  # chat 42 waited its retry_after
    rows = await db.fetch_all(
        "select recipient, attempts, status from jobs where kind = 'telegram.message' order by recipient")
    assert rows == [{"recipient": "42", "attempts": 1, "status": "done"},
                    {"recipient": "43", "attempts": 1, "status": "done"}]


async def test_two_replicas_together_stay_under_the_global_rate(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    rate, messages = 4, 16
    async with autom_processes(tmp_path) as procs:
        settings = {"TELEGRAM_GLOBAL_RATE": str(rate), "WORKERS": "8"}
        replicas = [await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **settings) for _ in range(2)]
        async with httpx.AsyncClient() as client:
            for n in range(messages):  # one chat each: only the global budget holds them back
                url = replicas[n % 2].url + "/hooks/telegram"
                body = telegram_update(n + 1, 1000 + n, "/ping")
                response = await client.post(url, json=body, headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET})
                assert response.status_code == 202
        with trio.fail_after(40):
            calls = await telegram_stub.wait_for_calls(messages, method="sendMessage")
        await wait_until(lambda: _done(db, messages), timeout=10)
        for proc in replicas:
            proc.terminate()
        for proc in replicas:
            assert await proc.wait(timeout=20) == 0
    pongs = sorted(c.time for c in calls if c.params["text"] == "pong")
    assert len(pongs) == messages
    # GCRA: a burst of at most `rate`, then `rate` a second, across both replicas together
    assert pongs[-1] - pongs[0] >= (messages - rate) / rate - 0.5
    attempts = await db.fetch_all("select distinct attempts from jobs where kind = 'telegram.message'")
    assert attempts == [{"attempts": 1}]


async def test_chatid_is_answered_with_the_chats_id(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url)
        async with httpx.AsyncClient(base_url=proc.url) as client:
            await post_telegram(client, telegram_update(1, -100555, "/chatid@autom_stub_bot"))
        with trio.fail_after(15):
            (call,) = await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=-100555)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    assert call.params["text"].startswith("This chat's id is -100555")


async def test_a_chat_telegram_refuses_for_ever_fails_for_good_after_max_defer_seconds_with_an_alert(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    """Telegram answers 429 to every send to chat 42: the pong is deferred (not failed)
    each time, until it has been refused for MAX_DEFER_SECONDS; then it fails for good and
    the usual failure alert reaches the alert chat. Before, it deferred for ever, silently."""
    telegram_stub.plan("sendMessage", [Reply(status=429, retry_after=1)] * 100, chat_id=42)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, MAX_DEFER_SECONDS="3")
        async with httpx.AsyncClient(base_url=proc.url) as client:
            assert (await post_telegram(client, telegram_update(1, 42, "/ping"))).status_code == 202
        with trio.fail_after(30):
            (alert,) = await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    refused = telegram_stub.calls_of("sendMessage", chat_id=42)
    # about one a second until the next try would come more than 3 s after the first refusal
    assert 2 <= len(refused) <= 6, [c.time for c in refused]
    assert refused[-1].time - refused[0].time >= 3 - 1.0 - 0.3, [c.time for c in refused]
    (job,) = await db.fetch_all(
        "select status, attempts, last_error from jobs where kind = 'telegram.message'")
    assert job["status"] == "failed"
    assert job["last_error"].startswith(
        "deferred for more than 3 s (MAX_DEFER_SECONDS): Defer: telegram sendMessage: HTTP 429"), job
    assert job["attempts"] == 1  # the refusals before the last were deferrals, not attempts
    assert "telegram.message" in alert.params["text"]
    log = proc.log_text()
    assert "job failed for good: deferred for more than 3 s" in log


@pytest.mark.parametrize("messages", [16, pytest.param(200, marks=pytest.mark.slow)])
async def test_one_chats_backlog_goes_out_at_its_rate_in_order_with_about_one_claim_per_message(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub, messages: int
) -> None:
    """A chat's backlog waits for its slots without being claimed again and again (migrations/0026).

    Issue 31's test: 200 messages for one chat at TELEGRAM_CHAT_RATE=1 are sent once each,
    in order, one a second (no faster overall: the span, not each gap), with fewer than 250
    claims (a one-second chat interval is longer than the workers' poll, so a job claimed
    before its slot shows as a claim too many).
    200 takes over 200 s: marked slow (run after the suite, `python -m pytest -m slow`);
    the main suite runs the same with 16 (about 16 s): the claims per message do not grow
    with the backlog (each job waits for its slot once, whatever its place)."""
    from autom.jobs.models import NewJob
    from autom.jobs.store import JobStore

    rate = 1
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, TELEGRAM_CHAT_RATE=str(rate), WORKERS="8")
        enqueued = time.time()  # the stub's clock (epoch s), as the database's slots
        await JobStore(db).enqueue_many([NewJob("telegram.send", {"chat_id": 42, "text": f"m{n}"}, recipient="42")
                                         for n in range(messages)])
        with trio.fail_after(messages / rate + 45):
            calls = await telegram_stub.wait_for_calls(messages, method="sendMessage", chat_id=42)
        await wait_until(lambda: _sent(db, messages), timeout=10)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    assert [c.params["text"] for c in calls] == [f"m{n}" for n in range(messages)]  # in order, each once
    # one a second: not faster overall. The chat's slots are an interval apart from the first,
    # taken after the enqueue (migrations/0033), and each send goes at its slot or later, so
    # the last cannot arrive before `enqueued + (messages - 1) / rate`; a loaded machine only
    # makes it later (the slack: a slot taken up to 1 ms early at each of them, 5 ms at the
    # last). And no two closer than the interval, however busy the machine: the next send
    # is taken no sooner than an interval after Telegram answered the last (migrations/0038),
    # and the answer comes after the message arrived (the slack: the take's 1 ms).
    arrived = [round(c.time - enqueued, 3) for c in calls]
    assert calls[-1].time - enqueued >= (messages - 1) / rate - (0.01 + 0.001 * messages), arrived
    assert min(b.time - a.time for a, b in itertools.pairwise(calls)) >= 1 / rate - 0.002, arrived
    # and at its rate, not slower: each next job is looked for when it becomes due (a job
    # moved later when Telegram answered was once found only at the next poll: one a 2 s)
    assert calls[-1].time - calls[0].time <= (messages - 1) / rate * 1.3 + 3, arrived
    claims = await db.fetch_val("select sum(autom_lease_generation(lease)) from jobs where kind = 'telegram.send'")
    assert claims < 1.25 * messages, claims  # the "fewer than 250 claims" for 200
    assert await db.fetch_val("select count(*) from telegram_reservations") == 0


async def test_workers_catching_up_on_late_slots_keep_to_the_bots_rate(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    """Workers that fall behind their reserved slots and then catch up do not send faster
    than TELEGRAM_GLOBAL_RATE: a late slot goes when the sends actually made leave room,
    else it takes the next slot (migrations/0033). The process is frozen (SIGSTOP) for 4 s
    while 60 messages to 60 chats go out at 5 a second: when it wakes, about 20 slots have
    passed unused. Before, those went out at once beside the slots coming due (the rate-30
    soak sent 33-37 a second for minutes after its workers lagged)."""
    from autom.jobs.models import NewJob
    from autom.jobs.store import JobStore

    messages, rate = 60, 5
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, TELEGRAM_GLOBAL_RATE=str(rate),
                                 WORKERS="8")
        await JobStore(db).enqueue_many([NewJob("telegram.send", {"chat_id": 1000 + n, "text": f"m{n}"})
                                         for n in range(messages)])
        with trio.fail_after(30):
            await telegram_stub.wait_for_calls(10, method="sendMessage")
        proc.send_signal(signal.SIGSTOP)
        try:
            await trio.sleep(4)  # the scenario: slots pass while no worker runs
        finally:
            proc.send_signal(signal.SIGCONT)
        with trio.fail_after(60):
            calls = await telegram_stub.wait_for_calls(messages, method="sendMessage")
        await wait_until(lambda: _sent(db, messages), timeout=10)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    assert sorted(c.params["text"] for c in calls) == sorted(f"m{n}" for n in range(messages))  # each once
    # a second of slack: the woken process, busy, may hold a request back that long (before,
    # 20 arrived within 0.1 s: far over even this)
    assert over_the_limit([c.time for c in calls], rate=rate, burst=rate, slack=1.0) == []
    claims = await db.fetch_val("select sum(autom_lease_generation(lease)) from jobs where kind = 'telegram.send'")
    # a job that waits is claimed twice (its slot reserved, then taken); one held back in the
    # catch-up once more (measured: 135 for 60); the bound is 3 a job
    assert claims <= 3 * messages, claims


def over_the_limit(times: list[float], *, rate: float, burst: float, slack: float = 0.3) -> list[tuple[int, float]]:
    """The stretches of sends (how many, over how many seconds) that a limit of ``rate`` a
    second with bursts of ``burst`` does not allow: n sends need (n - burst) / rate seconds.
    ``slack``: how much closer than their slots two sends may arrive at the stub (the
    first one's request held up a moment longer than the second's)."""
    times = sorted(times)
    return [(j - i + 1, round(times[j] - times[i], 3))
            for i in range(len(times)) for j in range(i + 1, len(times))
            if j - i + 1 > burst + rate * (times[j] - times[i] + slack)]


async def _sent(db: Any, n: int) -> bool:
    return int(await db.fetch_val("select count(*) from jobs where kind = 'telegram.send' and status = 'done'")) >= n
