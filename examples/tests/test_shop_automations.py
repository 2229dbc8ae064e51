"""The shop's automations, tested as autom runs them: a real PostgreSQL (``autom.testing``),
the CRM and Telegram stubbed at the network edge."""

from __future__ import annotations

import json
import os

from shop_automations import build_app

from autom import App
from autom.testing import HttpStub, hmac_signature, open_testbed
from autom.testing import running_http_stub as running_crm

ORDER = {"id": 1001, "email": "Ada@Example.com", "name": "Ada", "total": "42.00 EUR"}
MANAGER = os.environ["MANAGER_CHAT_ID"]


def shop(crm: HttpStub) -> App:
    return build_app({**os.environ, "CRM_URL": crm.url})


async def test_a_signed_order_becomes_one_job_and_a_forged_one_is_refused() -> None:
    async with running_crm() as crm, open_testbed(shop(crm)) as bed:
        body = json.dumps(ORDER).encode()
        forged = await bed.post("shop", body, {"X-Shop-Signature": hmac_signature("wrong", body)})
        signed = await bed.post("shop", body, {"X-Shop-Signature": hmac_signature("shop-test-secret", body)})
    assert forged.status == 401
    assert signed.status == 202
    assert [(job.kind, job.recipient) for job in signed.jobs] == [("shop.order", "shop:ada@example.com")]


async def test_an_order_is_upserted_in_the_crm_once_and_told_to_the_manager() -> None:
    async with running_crm() as crm, open_testbed(shop(crm)) as bed:
        crm.answers = [(503, {"error": "busy"})]  # the first attempt fails at the CRM...
        first = await bed.run_job("shop.order", ORDER)
        second = await bed.run(first.id)  # ...its retry upserts, once
    assert first.status == "pending" and "HTTP PUT 127.0.0.1: HTTP 503" in (first.error or "")
    assert second.status == "done" and second.once_keys == ["crm:order:1001"]
    upserts = [r for r in crm.requests if r["method"] == "PUT"]
    assert len(upserts) == 2 and {u["headers"]["idempotency-key"] for u in upserts} == {f"autom-{first.id}-crm-upsert"}
    second.assert_enqueued("telegram.send", chat_id=MANAGER, text="New order #1001 from Ada@Example.com: 42.00 EUR")
    assert first.enqueued == []  # the failed run told nobody


async def test_a_refused_upsert_fails_the_order_for_good() -> None:
    async with running_crm() as crm, open_testbed(shop(crm)) as bed:
        crm.answers = [(422, {"error": "email is invalid"})]
        run = await bed.run_job("shop.order", ORDER)
    assert run.status == "failed" and "HTTP 422" in (run.error or "") and run.enqueued == []


async def test_the_digest_tells_the_manager_about_yesterday_and_telegram_gets_it() -> None:
    async with running_crm() as crm, open_testbed(shop(crm)) as bed:
        crm.default = {"count": 3, "total": "99.00 EUR"}
        digest = await bed.run_job("shop.digest", {"slot": "2026-12-02"})
        message = digest.assert_enqueued("telegram.send", chat_id=MANAGER)
        sent = await bed.run(message.id)
    assert crm.requests[0]["query"] == "day=2026-12-01"
    assert sent.status == "done"
    assert [m["text"] for m in bed.telegram.messages(MANAGER)] == ["Orders on 01 Dec: 3, total 99.00 EUR"]
