"""A shop's automations on autom: orders from the web shop go to the CRM and to the manager.

Run it (from this folder): ``AUTOM_APP=shop_automations:app autom dev``

- ``POST /hooks/shop``: the shop signs each order, ``X-Shop-Signature: sha256=<hex
  HMAC-SHA256 of the body>`` with SHOP_WEBHOOK_SECRET; one ``shop.order`` job per order.
- ``shop.order``: upserts the customer in the CRM (once per order, with an
  idempotency key), then hands the manager a Telegram message (``telegram.send``).
- ``shop.digest``: daily at 09:00 (TZ), yesterday's orders from the CRM, to the manager.

Settings (environment or ``.env``): SHOP_WEBHOOK_SECRET, CRM_URL, CRM_TOKEN,
MANAGER_CHAT_ID, besides autom's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta

from dotenv import dotenv_values

from autom import App, HandlerContext, Job, NewJob, Parsed, ParseError, PermanentError
from autom.sources.base import Headers, id_field, load_object, object_or_none, verify_sha256_header


@dataclass(frozen=True)
class ShopConfig:
    """The shop's own settings."""

    webhook_secret: str
    crm_url: str
    crm_token: str
    manager_chat_id: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ShopConfig:
        """Read the settings; a missing one stops ``autom run`` with its name (exit 1)."""
        names = ("SHOP_WEBHOOK_SECRET", "CRM_URL", "CRM_TOKEN", "MANAGER_CHAT_ID")
        missing = [name for name in names if not env.get(name)]
        if missing:
            raise RuntimeError(f"missing setting(s) {', '.join(missing)} (see examples/README.md)")
        return cls(env["SHOP_WEBHOOK_SECRET"], env["CRM_URL"].rstrip("/"), env["CRM_TOKEN"], env["MANAGER_CHAT_ID"])


class ShopSource:
    """Orders from the shop at ``POST /hooks/shop``; redeliveries of one order count once (its ``id``)."""

    name = "shop"
    secret_headers = frozenset({"x-shop-signature"})
    sender_retries = True  # the shop retries refused deliveries: it may be asked to come back later

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode("utf-8")

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff ``X-Shop-Signature`` is ``sha256=`` + the HMAC of the raw body."""
        verify_sha256_header(headers, body, self._secret, "x-shop-signature", "shop")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """The order's id."""
        order = object_or_none(body)
        return None if order is None else id_field(order)

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``shop.order`` job per order; a customer's orders run one at a time, in order."""
        order = load_object(text)
        order_id = id_field(order)
        if order_id is None or not isinstance(order.get("email"), str):
            raise ParseError("an order needs an id and an email")
        job = NewJob("shop.order", order, key=f"shop.order:{order_id}", recipient=f"shop:{order['email'].lower()}")
        return Parsed(order_id, [job])


def build_app(env: Mapping[str, str]) -> App:
    """The App of the shop, configured from ``env`` (tests pass their own)."""
    config = ShopConfig.from_env(env)
    app = App()
    app.source(ShopSource(config.webhook_secret))
    crm_headers = {"Authorization": f"Bearer {config.crm_token}"}

    @app.handler("shop.order", max_attempts=10, timeout=60)
    async def order(ctx: HandlerContext, job: Job) -> None:
        """Upsert the customer in the CRM (once), then tell the manager."""
        order = job.payload
        async with ctx.once(f"crm:order:{order['id']}") as todo:
            if todo:
                response = await ctx.http.put(
                    f"{config.crm_url}/contacts/{order['email']}",
                    json={"email": order["email"], "name": order.get("name"), "last_order": order["id"]},
                    headers={**crm_headers, "Idempotency-Key": ctx.idempotency_key("crm-upsert")},
                )
                ctx.check(response)  # 422: failed for good (alert); 429/5xx: retried
        text = f"New order #{order['id']} from {order['email']}: {order.get('total', '?')}"
        await ctx.enqueue("telegram.send", {"chat_id": config.manager_chat_id, "text": text},
                          recipient=config.manager_chat_id)

    @app.handler("shop.digest", timeout=60)
    async def digest(ctx: HandlerContext, job: Job) -> None:
        """Yesterday's orders, from the CRM, in one message (the slot is the local date of the run)."""
        day = date.fromisoformat(job.payload["slot"]) - timedelta(days=1)
        response = await ctx.http.get(f"{config.crm_url}/orders/summary", params={"day": day.isoformat()},
                                      headers=crm_headers)
        ctx.check(response)
        summary = response.json()
        if not isinstance(summary, dict) or "count" not in summary:
            raise PermanentError("the CRM's summary has no count")
        text = f"Orders on {day:%d %b}: {summary['count']}, total {summary.get('total', 0)}"
        await ctx.enqueue("telegram.send", {"chat_id": config.manager_chat_id, "text": text},
                          key=f"shop.digest:{day}", recipient=config.manager_chat_id)

    app.schedule("shop.digest", daily_at="09:00")
    return app


#: what ``AUTOM_APP=shop_automations:app`` serves: settings from the environment over ``.env``
app = build_app({**{k: v for k, v in dotenv_values(".env").items() if v is not None}, **os.environ})
