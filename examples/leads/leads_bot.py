"""Leads: a signed form → a model reads what the client needs → a card in the managers' chat with
"Take it" → the taker's name on the card and the reminder cancelled; nobody takes it → a reminder.

Run it (from this folder): ``AUTOM_APP=leads_bot:app autom dev``. Settings: LEADS_FORM_SECRET,
MANAGERS_CHAT_ID, MODEL_URL (an OpenAI-compatible API, e.g. https://api.openai.com/v1),
MODEL_NAME, MODEL_API_KEY, REMIND_MINUTES (default 30), besides autom's own.
"""

from __future__ import annotations

import os
from datetime import timedelta

from autom import App, HandlerContext, Job, NewJob, Parsed, ParseError
from autom.sources.base import Headers, load_object, verify_sha256_header

app = App()
env = os.environ
CHAT, REMIND = env["MANAGERS_CHAT_ID"], timedelta(minutes=float(env.get("REMIND_MINUTES", "30")))
ASK = "In one or two short lines: what does this client need, by when, for what budget?"


class LeadForm:  # POST /hooks/leads, signed X-Signature: sha256=<hex HMAC-SHA256 of the body>
    name, secret_headers = "leads", frozenset({"x-signature"})

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        verify_sha256_header(headers, body, env["LEADS_FORM_SECRET"].encode(), "x-signature", "leads")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        return None  # a lead is one job by its key, however often the form posts it

    def parse(self, headers: Headers, text: str) -> Parsed:
        lead = load_object(text)
        if not isinstance(lead.get("id"), int | str) or not isinstance(lead.get("message"), str):
            raise ParseError("a lead needs an id and a message")
        return Parsed(None, [NewJob("lead.new", lead, key=f"lead:{lead['id']}")])


@app.handler("lead.new", timeout=60)
async def new_lead(ctx: HandlerContext, job: Job) -> None:
    lead = job.payload
    r = await ctx.http.post(f"{env['MODEL_URL'].rstrip('/')}/chat/completions", json={
        "model": env.get("MODEL_NAME", "gpt-4o-mini"),
        "messages": [{"role": "system", "content": ASK}, {"role": "user", "content": lead["message"]}],
    }, headers={"Authorization": f"Bearer {env['MODEL_API_KEY']}"} if env.get("MODEL_API_KEY") else {})
    ctx.check(r)  # 429, or overloaded (503/529): tried again after its Retry-After
    needs = r.json()["choices"][0]["message"]["content"].strip()
    async with ctx.once(f"card:{lead['id']}") as todo:  # one card, however often this job runs
        if todo:
            card = f"New lead #{lead['id']}: {lead.get('name', '?')}, {lead.get('contact', '?')}\n{needs}"
            sent = await ctx.telegram.send_message(CHAT, card, buttons=[[("Take it", f"take:{lead['id']}")]])
            await ctx.enqueue("lead.remind", {"id": lead["id"], "message_id": sent["message_id"]},
                              key=f"lead:{lead['id']}", run_at=REMIND)


@app.callback("take")
async def take(ctx: HandlerContext, job: Job) -> None:
    press, lead_id = job.payload, job.payload["data"].partition(":")[2]
    who = press["from"].get("first_name") or press["from"].get("username") or "someone"
    async with ctx.once(f"take:{lead_id}") as first:  # presses of a chat run one at a time
        if first:
            await ctx.cancel("lead.remind", f"lead:{lead_id}")  # committed with the block
            await ctx.telegram.answer_callback(press["id"], "It is yours")
            await ctx.telegram.edit_message(press["chat_id"], press["message_id"],
                                            f"{press['message_text']}\n\nTaken by {who}")
    if not first:
        await ctx.telegram.answer_callback(press["id"], "Someone took it already")


@app.handler("lead.remind")
async def remind(ctx: HandlerContext, job: Job) -> None:
    await ctx.telegram.send_message(CHAT, f"Lead #{job.payload['id']} is still waiting: who takes it?",
                                    reply_to_message_id=job.payload["message_id"])


app.source(LeadForm())
