"""The leads example (examples/leads) served by the real ``autom run``: a signed lead → the model →
a card with a button in the Telegram stub; a press → the press answered, the card edited, the
reminder cancelled; a lead nobody takes → one reminder; a model that answers 429 twice → one card.

The timings are printed (bench/RESULTS.md, "Telegram bots", records them), not asserted: the
assertions wait generously, as this machine is shared.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from autom.testing import ModelStub, running_model_stub
from autom.testing.telegram_stub import TelegramStub
from tests.support.processes import AutomProcess, AutomProcesses
from tests.support.service import TG_SECRET

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "leads"
FORM_SECRET = "leads-form-secret"
MANAGERS = 900  # a private chat: the chat's 1-s spacing, not a group's 3 s, between the card and its edit
WAIT = 30.0
REMINDER = "select status from jobs where kind = 'lead.remind' and key = %(key)s"
REMINDER_MESSAGE = "select payload ->> 'message_id' from jobs where kind = 'lead.remind' and key = %(key)s"
LEAD_JOB = "select status from jobs where kind = 'lead.new' and key = %(key)s"


def lead(lead_id: int) -> dict[str, Any]:
    return {"id": lead_id, "name": f"Client {lead_id}", "contact": f"c{lead_id}@example.com",
            "message": "We need a new website for our bakery by March, budget around 3000 EUR."}


async def start(procs: AutomProcesses, dsn: str, stub: TelegramStub, model: ModelStub,
                remind_minutes: str) -> AutomProcess:
    return await procs.start(
        dsn=dsn, telegram_url=stub.url, AUTOM_APP="leads_bot:app", PYTHONPATH=str(EXAMPLE),
        LEADS_FORM_SECRET=FORM_SECRET, MANAGERS_CHAT_ID=str(MANAGERS), MODEL_URL=model.url,
        REMIND_MINUTES=remind_minutes, TELEGRAM_CHAT_RATE="20")


async def post_lead(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    raw = json.dumps(body).encode()
    signature = "sha256=" + hmac.new(FORM_SECRET.encode(), raw, hashlib.sha256).hexdigest()
    posted = time.time()
    response = await client.post("/hooks/leads", content=raw, headers={"X-Signature": signature})
    assert response.status_code == 202, response.text
    return posted


def cards(stub: TelegramStub, lead_id: int) -> list[Any]:
    return [c for c in stub.calls_of("sendMessage", MANAGERS) if c.params["text"].startswith(f"New lead #{lead_id}:")]


async def wait_for(condition: Any, what: str) -> None:
    """Wait (up to WAIT s) until ``condition()`` is true; ``what`` names it in the failure."""
    with trio.move_on_after(WAIT):
        while not condition():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"no {what} within {WAIT:g} s")


async def test_leads_end_to_end(dsn: str, db: Any, procs: AutomProcesses, stub: TelegramStub) -> None:
    async with running_model_stub() as model:
        proc = await start(procs, dsn, stub, model, remind_minutes="10")
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
            # a lead → its card, with the button
            posted = await post_lead(client, lead(1))
            await wait_for(lambda: cards(stub, 1), "the card")
            [card] = cards(stub, 1)
            assert card.params["reply_markup"] == {"inline_keyboard": [[{"text": "Take it",
                                                                          "callback_data": "take:1"}]]}
            message_id = await card_message_id(db, "lead:1")  # committed just after the card went out
            # a manager presses it
            update = {"update_id": 5001, "callback_query": {
                "id": "press-1", "chat_instance": "1", "data": "take:1",
                "from": {"id": 77, "is_bot": False, "first_name": "Bob"},
                "message": {"message_id": message_id, "date": 1, "text": card.params["text"],
                            "chat": {"id": MANAGERS, "type": "private"}}}}
            pressed = time.time()
            response = await client.post("/hooks/telegram", json=update,
                                         headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET})
            assert response.status_code == 202, response.text
            await wait_for(lambda: stub.answers("press-1") and stub.edits(MANAGERS), "the answer and the edit")
            # an edit the chat's spacing deferred runs the press again: its second answer is refused
            answer = stub.calls_of("answerCallbackQuery")[0]
            [edit] = stub.calls_of("editMessageText")
            assert answer.params == {"callback_query_id": "press-1", "text": "It is yours"}
            assert edit.params["text"] == card.params["text"] + "\n\nTaken by Bob"
            assert edit.params["message_id"] == message_id
            await wait_for_row(db, REMINDER, {"key": "lead:1"}, "cancelled")

            # a busy model: two 429s, then the card, once
            model.refuse(2, status=429, retry_after=0.3)
            await post_lead(client, lead(2))
            await wait_for_row(db, LEAD_JOB, {"key": "lead:2"}, "done")  # its last run is over: no card to come
            assert len(cards(stub, 2)) == 1
            assert len(model.completions()) == 4  # lead 1's, then lead 2's three
        print(f"\nleads e2e: card {(card.time - posted) * 1000:.0f} ms after the lead; answer "
              f"{(answer.time - pressed) * 1000:.0f} ms, edit {(edit.time - pressed) * 1000:.0f} ms after the press")
        proc.terminate()
        assert await proc.wait(timeout=20) == 0

        # a lead nobody takes: one reminder, a reply to its card
        proc = await start(procs, dsn, stub, model, remind_minutes="0.02")
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
            await post_lead(client, lead(3))
            await wait_for_row(db, REMINDER, {"key": "lead:3"}, "done")
        nudges = [m for m in stub.messages(MANAGERS) if m["text"].startswith("Lead #3 is still waiting")]
        assert len(cards(stub, 3)) == 1 and len(nudges) == 1
        assert nudges[0]["reply_to_message_id"] == await card_message_id(db, "lead:3")
        proc.terminate()
        assert await proc.wait(timeout=20) == 0


async def wait_for_row(db: Any, sql: str, params: dict[str, Any], status: str) -> None:
    with trio.fail_after(WAIT):
        while await db.fetch_val(sql, params) != status:
            await trio.sleep(0.05)


async def card_message_id(db: Any, key: str) -> int:
    """The card's message_id, as its reminder job keeps it (committed with the card's once key)."""
    with trio.fail_after(WAIT):
        while (found := await db.fetch_val(REMINDER_MESSAGE, {"key": key})) is None:
            await trio.sleep(0.02)
    return int(found)
