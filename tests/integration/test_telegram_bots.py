"""Telegram bots on the public API: commands and callbacks routed in the App, buttons, edits and
answers through ``ctx.telegram`` (within the send limits), against the Bot API stub and a real
PostgreSQL (``autom.testing``)."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
import trio

from autom import App, HandlerContext, Job, Router
from autom.app import AppError
from autom.config import Settings
from autom.errors import Defer
from autom.limits import SendLimiter
from autom.telegram import open_telegram
from autom.testing import Reply, open_testbed
from tests.support.queue import release

SECRET = "tg-secret"
GROUP = -100555


def update(update_id: int, **part: Any) -> bytes:
    return json.dumps({"update_id": update_id, **part}).encode()


def message(text: str, chat: int = GROUP) -> dict[str, Any]:
    return {"message_id": 9, "date": 1, "chat": {"id": chat, "type": "group"}, "text": text,
            "from": {"id": 7, "username": "ann"}}


def press(data: str | None, query_id: str = "q1", chat: int = GROUP) -> dict[str, Any]:
    return {"id": query_id, "data": data, "chat_instance": "1",
            "from": {"id": 7, "is_bot": False, "first_name": "Ann"},
            "message": {"message_id": 3, "date": 1, "chat": {"id": chat, "type": "group"}}}


def bot_app() -> App:
    app = App()

    @app.command("take")
    async def take(ctx: HandlerContext, job: Job) -> None:
        await ctx.telegram.send_message(job.payload["chat_id"], f"taken by {job.payload['from']['username']}")

    @app.callback("take")
    async def take_button(ctx: HandlerContext, job: Job) -> None:
        await ctx.telegram.answer_callback(job.payload["id"], f"you took {job.payload['data']}")

    @app.callback("quiet")
    async def quiet(ctx: HandlerContext, job: Job) -> None:
        pass  # answered empty when it returns

    return app


async def deliver(bed: Any, body: bytes) -> Any:
    delivery = await bed.post("telegram", body, {"X-Telegram-Bot-Api-Secret-Token": SECRET})
    assert delivery.status == 202, delivery.body
    [job] = delivery.jobs
    return job, await bed.run(job.id)


async def test_commands_and_callbacks_are_routed_and_built_ins_stay(dsn: str) -> None:
    async with open_testbed(bot_app(), database_url=dsn, settings={"telegram_webhook_secret": SECRET}) as bed:
        for n, text in enumerate(["/take", "/TAKE@autom_stub_bot now", "/ping", "/chatid", "hello", "/other"]):
            _, run = await deliver(bed, update(n, message=message(text)))
            assert run.status == "done", run.error
        texts = [m["text"] for m in bed.telegram.messages(GROUP)]
        assert texts[:3] == ["taken by ann", "taken by ann", "pong"]
        assert texts[3].startswith(f"This chat's id is {GROUP}") and len(texts) == 4

        job, run = await deliver(bed, update(10, callback_query=press("take:17", "q-take")))
        assert (job.kind, job.recipient, run.status) == ("telegram.callback", f"{GROUP}:cb", "done")
        assert job.payload["from"] == press("x")["from"]
        for n, (data, query_id) in enumerate([("quiet", "q-quiet"), ("nobody:1", "q-none"), (None, "q-game")]):
            _, run = await deliver(bed, update(20 + n, callback_query=press(data, query_id)))
            assert run.status == "done", run.error
    answers = {a["callback_query_id"]: a.get("text") for a in bed.telegram.answers()}
    assert answers == {"q-take": "you took take:17", "q-quiet": None, "q-none": None, "q-game": None}
    assert len(bed.telegram.answers()) == 4  # each press answered once


async def test_buttons_edits_and_answers(dsn: str) -> None:
    app = App(builtins=False)
    seen: dict[str, Any] = {}

    @app.handler("card")
    async def card(ctx: HandlerContext, job: Job) -> None:
        sent = await ctx.telegram.send_message(GROUP, "a card", buttons=[[("Take it", "take:1"), ("Skip", "skip")]])
        seen["sent"] = sent
        seen["edited"] = await ctx.telegram.edit_message(GROUP, sent["message_id"], "taken", buttons=[[("Undo", "u")]])
        seen["same"] = await ctx.telegram.edit_message(GROUP, sent["message_id"], "taken")
        seen["late"] = await ctx.telegram.answer_callback("q-old", "hi")

    async with open_testbed(app, database_url=dsn) as bed:
        bed.telegram.plan("editMessageText", [Reply(), Reply(status=400, description=(
            "Bad Request: message is not modified: specified new message content and reply markup are exactly "
            "the same as a current content and reply markup of the message"))])
        bed.telegram.plan("answerCallbackQuery", [Reply(status=400, description=(
            "Bad Request: query is too old and response timeout expired or query ID is invalid"))])
        run = await bed.run_job("card")
        assert run.status == "done", run.error
        [sent] = bed.telegram.messages(GROUP)
        assert sent["reply_markup"] == {"inline_keyboard": [[{"text": "Take it", "callback_data": "take:1"},
                                                             {"text": "Skip", "callback_data": "skip"}]]}
        first, second = bed.telegram.edits(GROUP)
    assert isinstance(seen["sent"]["message_id"], int)
    assert first == {"chat_id": GROUP, "message_id": seen["sent"]["message_id"], "text": "taken",
                     "reply_markup": {"inline_keyboard": [[{"text": "Undo", "callback_data": "u"}]]}}
    assert "reply_markup" not in second  # no buttons: the keyboard goes
    assert seen["edited"]["text"] == "taken"
    assert seen["same"] == {"message_id": seen["sent"]["message_id"]}
    assert seen["late"] is False


@pytest.mark.parametrize(("buttons", "error"), [
    ([[("Take it", "take:" + "x" * 60)]], r"data 'take:x+' is 65 bytes; Telegram takes at most 64"),
    ([[("Take it", "é" * 33)]], r"is 66 bytes"),
    ([[("", "a")]], r"label '' must be a non-empty text"),
    ([[("Take it", "")]], r"data must be a non-empty text"),
    ([("Take it", "a")], r"is not a \(label, data\) pair"),
    ("take", r"must be rows"),
])
async def test_bad_buttons_fail_the_job_for_good_before_anything_is_sent(dsn: str, buttons: Any,
                                                                       error: str) -> None:
    app = App(builtins=False)

    @app.handler("card")
    async def card(ctx: HandlerContext, job: Job) -> None:
        await ctx.telegram.send_message(GROUP, "a card", buttons=buttons)

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("card", max_attempts=3)
        assert bed.telegram.calls_of("sendMessage") == []
    assert run.status == "failed" and run.attempts == 1
    assert re.match(r"PermanentError: telegram button", run.error or ""), run.error
    assert re.search(error, run.error or ""), run.error


async def test_a_split_text_carries_its_buttons_under_the_last_part(dsn: str) -> None:
    app = App(builtins=False)

    @app.handler("long")
    async def long(ctx: HandlerContext, job: Job) -> None:
        await ctx.telegram.send_message(GROUP, "line\n" * 1000, buttons=[[("OK", "ok")]])

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("long")
        parts = bed.telegram.messages(GROUP)
    assert run.status == "done", run.error
    assert [("reply_markup" in p) for p in parts] == [False, True]


async def test_edits_and_answers_go_through_the_send_limits(db: Any, telegram_stub: Any) -> None:
    settings = Settings(telegram_api=telegram_stub.url, telegram_bot_token="1:x", telegram_alert_chat_id="-1")
    async with open_telegram(settings) as client:
        client.limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
        sent = await client.send_message(42, "card", buttons=[[("Take", "take")]])
        # the chat's next send is a second away: the edit waits for it (the job is deferred) ...
        with pytest.raises(Defer):
            await client.edit_message(42, sent["message_id"], "taken")
        # ... an answer to a press goes to no chat: the bot's budget only
        assert await client.answer_callback("q1") is True
        telegram_stub.plan("answerCallbackQuery", [Reply(status=429, retry_after=3)])
        with pytest.raises(Defer):
            await client.answer_callback("q2")
    assert [c.method for c in telegram_stub.calls] == ["sendMessage", "answerCallbackQuery", "answerCallbackQuery"]


def test_registration_mistakes_fail_at_registration_or_start() -> None:
    async def handler(ctx: HandlerContext, job: Job) -> None:
        pass

    app = App()
    app.command("/take")(handler)
    with pytest.raises(AppError, match=r"command 'take' is registered twice"):
        app.command("Take")(handler)
    for bad in ("", "take it", "a" * 33, "/", "tаke"):  # the last has a Cyrillic a
        with pytest.raises(AppError, match="a Telegram command is 1-32 letters"):
            app.command(bad)
    app.callback("take")(handler)
    with pytest.raises(AppError, match=r"callback 'take' is registered twice"):
        app.callback("take")(handler)
    for bad in ("", "take:1", "a b", "x" * 64):
        with pytest.raises(AppError, match="a prefix is 1-63 characters"):
            app.callback(bad)
    with pytest.raises(AppError, match="must be an async def"):
        app.command("sync")(lambda ctx, job: None)
    router = Router()
    router.command("take")(handler)
    with pytest.raises(AppError, match="registered twice"):
        app.include(router)
    app.validate()
    app.handler("telegram.message")(handler)
    with pytest.raises(AppError, match=r"replaces the handler that runs the commands \('take'\)"):
        app.validate()


async def test_a_button_press_clears_its_chats_blocked_mark(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("insert into telegram_blocked (chat_id, reason) values (%s, 'test')", [str(GROUP)])
    async with open_testbed(App(), database_url=dsn, settings={"telegram_webhook_secret": SECRET}) as bed:
        delivery = await bed.post("telegram", update(1, callback_query=press("x")),
                                  {"X-Telegram-Bot-Api-Secret-Token": SECRET})
        assert delivery.status == 202
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select count(*) from telegram_blocked").fetchone() == (0,)


async def test_a_callback_waits_for_no_slow_job_of_its_chat(dsn: str) -> None:
    """The README's promise: a press runs on its chat's own line ``<chat>:cb``, so a slow job on the
    chat's line (``<chat>``) does not hold it; it waits only behind earlier presses of the chat."""
    async with open_testbed(App(), database_url=dsn) as bed:
        slow = await bed.enqueue("telegram.message", {"chat_id": GROUP, "text": "hi"}, recipient=GROUP)
        await bed.enqueue("telegram.message", {"chat_id": GROUP, "text": "/ping"}, recipient=GROUP)
        pressed = await bed.enqueue("telegram.callback", {"id": "q9", "data": "x", "chat_id": GROUP},
                                    recipient=f"{GROUP}:cb")
        # the chat's first job is claimed and held (running, as a slow handler would be) ...
        claimed = await bed.deps.store.claim(100)
        ids = {job.id for job in claimed}
        # ... and the press is claimable beside it, in the same claim, the chat's second job is not
        assert slow in ids and pressed in ids and len(ids) == 2
        await release(bed.deps.store, [job for job in claimed])
        with trio.fail_after(30):
            run = await bed.run(pressed)
    assert run.status == "done", run.error
    assert bed.telegram.answers() == [{"callback_query_id": "q9"}]
