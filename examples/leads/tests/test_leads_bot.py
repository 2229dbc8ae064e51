"""The leads automation, tested as autom runs it: a real PostgreSQL (``autom.testing``), the model
and Telegram stubbed at the network edge."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from leads_bot import app

from autom.testing import ModelStub, hmac_signature, open_testbed, running_model_stub
from autom.testing import Testbed as Bed

SECRET = os.environ["LEADS_FORM_SECRET"]
CHAT = int(os.environ["MANAGERS_CHAT_ID"])
TG_SECRET = "leads-tg-secret"  # noqa: S105 (a test webhook secret)
LEAD = {"id": 17, "name": "Ada", "contact": "ada@example.com",
        "message": "Our roof leaks over the kitchen; we need it fixed before the rains, budget about 2000 EUR."}


@asynccontextmanager
async def leads(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Bed, ModelStub]]:
    async with running_model_stub(lambda text: "Roof repair over the kitchen, before the rains, ~2000 EUR") as model:
        monkeypatch.setenv("MODEL_URL", model.url)
        async with open_testbed(app, settings={"telegram_webhook_secret": TG_SECRET}) as bed:
            yield bed, model


async def post_lead(bed: Bed, lead: dict[str, Any], secret: str = SECRET) -> Any:
    body = json.dumps(lead).encode()
    return await bed.post("leads", body, {"X-Signature": hmac_signature(secret, body)})


def press(update_id: int, card: dict[str, Any], user: str, query_id: str) -> dict[str, Any]:
    markup = card["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
    return {"update_id": update_id, "callback_query": {
        "id": query_id, "chat_instance": "1", "data": markup,
        "from": {"id": hash(user) % 10_000, "is_bot": False, "first_name": user},
        "message": {"message_id": card["message_id"], "date": 1, "text": card["text"],
                    "chat": {"id": CHAT, "type": "supergroup"}}}}


async def test_a_lead_becomes_a_card_that_a_manager_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    async with leads(monkeypatch) as (bed, model):
        forged = await post_lead(bed, LEAD, secret="wrong")  # noqa: S106 (a forged signature)
        delivery = await post_lead(bed, LEAD)
        assert (forged.status, delivery.status) == (401, 202)
        [job] = delivery.jobs
        run = await bed.run(job.id)
        assert run.status == "done", run.error
        assert run.once_keys == ["card:17"]
        [asked] = model.completions()
        assert asked["messages"][-1]["content"] == LEAD["message"]
        [card] = [c.params for c in bed.telegram.calls_of("sendMessage", CHAT)]
        assert card["text"] == ("New lead #17: Ada, ada@example.com\n"
                                "Roof repair over the kitchen, before the rains, ~2000 EUR")
        assert card["reply_markup"] == {"inline_keyboard": [[{"text": "Take it", "callback_data": "take:17"}]]}
        reminder = run.assert_enqueued("lead.remind", id=17)
        card["message_id"] = reminder.payload["message_id"]

        for n, (user, query_id) in enumerate([("Bob", "q-bob"), ("Eve", "q-eve")]):
            pressed = await bed.post("telegram", press(100 + n, card, user, query_id),
                                     {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET})
            [press_job] = pressed.jobs
            assert (await bed.run(press_job.id)).status == "done"
        [edit] = bed.telegram.edits(CHAT)
        assert edit["message_id"] == card["message_id"] and edit["text"] == card["text"] + "\n\nTaken by Bob"
        answers = {a["callback_query_id"]: a.get("text") for a in bed.telegram.answers()}
        assert answers == {"q-bob": "It is yours", "q-eve": "Someone took it already"}
        row = await bed.db.fetch_one("select status from jobs where id = %(id)s", {"id": reminder.id})
        assert row == {"status": "cancelled"}


async def test_a_lead_nobody_takes_is_reminded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async with leads(monkeypatch) as (bed, _):
        run = await bed.run_job("lead.new", LEAD, key="lead:17")
        reminder = run.assert_enqueued("lead.remind", id=17)
        again = await bed.run(reminder.id)  # waits for its run_at (REMIND_MINUTES)
        assert again.status == "done", again.error
        card, nudge = bed.telegram.messages(CHAT)
    assert nudge == {"chat_id": str(CHAT), "text": "Lead #17 is still waiting: who takes it?",
                     "reply_to_message_id": reminder.payload["message_id"]}
    assert "reply_markup" in card


async def test_a_busy_model_delays_the_card_and_it_arrives_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async with leads(monkeypatch) as (bed, model):
        model.refuse(1, status=429, retry_after=0.2)
        model.refuse(1, status=529, retry_after=0.2)  # overloaded
        first = await bed.run_job("lead.new", LEAD, key="lead:17")
        second = await bed.run(first.id)
        third = await bed.run(first.id)
        cards = bed.telegram.messages(CHAT)
    assert (first.status, second.status, third.status) == ("pending", "pending", "done")
    assert "HTTP 429" in (first.error or "") and "HTTP 529" in (second.error or "")
    assert len(model.completions()) == 3 and len(cards) == 1


def test_the_automation_is_a_few_dozen_lines() -> None:
    source = (Path(__file__).resolve().parents[1] / "leads_bot.py").read_text()
    code = source.split('"""', 2)[2]  # after the module docstring
    assert len([line for line in code.splitlines() if line.strip()]) < 60
