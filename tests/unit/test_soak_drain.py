"""The soak's drain allowance: the least time Telegram's limits allow the backlog, plus a margin."""

from __future__ import annotations

from bench.soak import drain_allowance


def test_the_allowance_follows_the_global_rate_the_busiest_chat_and_the_margin() -> None:
    spread = {f"chat{n}": 1 for n in range(3000)}  # one job a chat: the bot's budget bounds it
    assert drain_allowance(spread, 60.0, chat_rate=1.0, global_rate=30.0) == 1.25 * 100 + 60
    one_chat = {"42": 200, "43": 1}  # a chat's own rate bounds it
    assert drain_allowance(one_chat, 30.0, chat_rate=1.0, global_rate=30.0) == 1.25 * 200 + 30
    assert drain_allowance({}, 30.0) == 30.0
