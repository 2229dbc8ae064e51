"""A button press waits for no slow job of its chat (README, Telegram bots): the real ``autom run``
with a command that runs long; a press in the same chat is answered while it still runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import trio

from autom.testing.telegram_stub import TelegramStub
from tests.support.processes import AutomProcesses
from tests.support.service import TG_SECRET

CHAT = 4242

SLOW_BOT = '''
import trio
from autom import App

app = App()


@app.command("slow")
async def slow(ctx, job):
    await trio.sleep(60)  # a slow job of the chat (a long report, a slow API)


@app.callback("ok")
async def ok(ctx, job):
    await ctx.telegram.answer_callback(job.payload["id"], "done")
'''


async def test_a_press_is_answered_while_a_slow_job_of_its_chat_runs(dsn: str, db: Any, tmp_path: Path,
                                                                     procs: AutomProcesses,
                                                                     stub: TelegramStub) -> None:
    workdir = tmp_path / "autom-1"  # the first process's working directory: its modules import
    workdir.mkdir()
    (workdir / "slow_bot.py").write_text(SLOW_BOT)
    proc = await procs.start(dsn=dsn, telegram_url=stub.url, AUTOM_APP="slow_bot:app",
                             SHUTDOWN_GRACE_SECONDS="1")
    chat = {"id": CHAT, "type": "private"}
    slow = {"update_id": 1, "message": {"message_id": 1, "date": 1, "chat": chat, "text": "/slow",
                                        "from": {"id": CHAT}}}
    queued = {"update_id": 2, "message": {"message_id": 2, "date": 1, "chat": chat, "text": "/ping",
                                          "from": {"id": CHAT}}}
    press = {"update_id": 3, "callback_query": {
        "id": "press-1", "chat_instance": "1", "data": "ok", "from": {"id": CHAT, "is_bot": False, "first_name": "A"},
        "message": {"message_id": 1, "date": 1, "chat": chat, "text": "a card"}}}
    headers = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}
    async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
        for update in (slow, queued):
            assert (await client.post("/hooks/telegram", json=update, headers=headers)).status_code == 202
        with trio.fail_after(30):  # the slow job holds the chat's line
            while await db.fetch_val("select status from jobs where kind = 'telegram.message' and key = "
                                     "'telegram:1'") != "running":
                await trio.sleep(0.02)
        pressed = time.time()
        assert (await client.post("/hooks/telegram", json=press, headers=headers)).status_code == 202
        with trio.fail_after(30):
            [answer] = await stub.wait_for_calls(1, method="answerCallbackQuery")
    rows = await db.fetch_all("select key, status from jobs where kind = 'telegram.message'")
    statuses = {row["key"]: row["status"] for row in rows}
    # answered while the chat's slow job still ran and its next message still waited for it
    assert statuses == {"telegram:1": "running", "telegram:2": "pending"}
    assert answer.params == {"callback_query_id": "press-1", "text": "done"}
    assert stub.messages(CHAT) == []  # no pong yet: /ping waits for /slow
    print(f"\npress answered {(answer.time - pressed) * 1000:.0f} ms after its update, beside a running slow job")
