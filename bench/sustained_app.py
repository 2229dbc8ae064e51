"""The App of bench/sustained.py's open-loop run (``AUTOM_APP=sustained_app:app``, bench/ on PYTHONPATH).

Every built-in (Telegram's ``/ping`` answers ``pong``; other messages are logged), and
the GitHub, Stripe and site deliveries' jobs call a CRM (``SUSTAINED_CRM_URL``, the
run's stub answers after 20 ms), as issue 27's mix asks: a handler that waits on a
network call, not one that only logs.
"""

from __future__ import annotations

import os

from autom import App, HandlerContext, Job

app = App()
CRM_URL = os.environ.get("SUSTAINED_CRM_URL", "http://127.0.0.1:9/crm")


async def to_crm(ctx: HandlerContext, job: Job) -> None:
    """POST the job's kind and id to the CRM; a 429 or 5xx is retried, another 4xx fails it."""
    response = await ctx.http.post(CRM_URL, json={"kind": job.kind, "job": job.id})
    ctx.check(response)


for kind in ("github.event", "stripe.event", "site.form"):
    app.handler(kind)(to_crm)
