"""``SendLimiter`` on a real PostgreSQL: per chat, per group, the bot's budget, 429s (migrations/0009)."""

from __future__ import annotations

from typing import Any

import pytest

from autom.errors import Defer
from autom.limits import SendLimiter


async def test_one_chat_waits_its_interval_while_another_chat_sends(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    await limiter.acquire(42)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert 0.5 < waited.value.after <= 1.0
    await limiter.acquire(43)  # another chat is not held back


async def test_a_group_chat_sends_at_most_twenty_a_minute(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=10.0, global_rate=30.0)
    await limiter.acquire(-100123)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(-100123)
    assert 2.5 < waited.value.after <= 3.0  # 60 s / 20
    await limiter.acquire(7)
    with pytest.raises(Defer) as private:
        await limiter.acquire(7)
    assert private.value.after <= 0.1


async def test_the_budget_is_shared_and_keeps_a_slot_for_alerts(db: Any) -> None:
    # two limiters stand for two replicas: the budget is the database's, not theirs
    first = SendLimiter(db, chat_rate=1.0, global_rate=3.0)
    second = SendLimiter(db, chat_rate=1.0, global_rate=3.0)
    await first.acquire(1)
    await second.acquire(2)  # burst 3, the last slot kept for alerts
    with pytest.raises(Defer) as waited:
        await first.acquire(3)
    assert 0 < waited.value.after <= 1 / 3 + 0.01
    await second.acquire(4, priority=True)  # an alert takes the kept slot
    with pytest.raises(Defer):
        await second.acquire(5, priority=True)


async def test_parts_of_one_message_take_their_slots_together(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=2.0, global_rate=30.0)
    await limiter.acquire(42, parts=3)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert 1.0 < waited.value.after <= 1.5  # three half-second slots


async def test_a_429_holds_that_chat_and_a_flood_of_them_pauses_every_send(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=100.0, global_rate=100.0)
    await limiter.pushed(42, 5.0)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert 4.0 < waited.value.after <= 5.0
    await limiter.acquire(43)  # one 429 holds one chat only
    await limiter.pushed(44, 2.0)
    await limiter.pushed(45, 2.0)  # the third within 10 s: Telegram limits the bot itself
    with pytest.raises(Defer) as paused:
        await limiter.acquire(46)
    assert 1.0 < paused.value.after <= 2.0
    with pytest.raises(Defer):
        await limiter.acquire(47, priority=True)  # alerts too: Telegram would refuse them as well


async def test_a_reservation_commits_asynchronously_for_its_own_transaction_only(db: Any) -> None:
    """telegram_acquire turns synchronous_commit off for the transaction it commits in (a lost
    reservation is harmless: SendLimiter.acquire); the connection's setting is left alone."""
    from autom.db.queries import Q

    params = {"chat": "42", "parts": 1, "chat_interval": 1.0, "global_interval": 1 / 30, "burst": 30.0,
              "priority": False}
    async with db.transaction() as tx:
        setting = await tx.fetch_val("show synchronous_commit")
        assert setting != "off"
        assert await tx.fetch_val(Q.telegram_acquire, params) == 0
        assert await tx.fetch_val("show synchronous_commit") == "off"
    async with db.transaction() as tx:
        assert await tx.fetch_val("show synchronous_commit") == setting
    assert await db.fetch_val("select count(*) from telegram_chats where chat_id = '42'") == 1
    with pytest.raises(Defer):  # the reservation holds
        await SendLimiter(db, chat_rate=1.0, global_rate=30.0).acquire(42)
