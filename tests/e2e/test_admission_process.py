"""Admission in the real ``autom run`` (CONTRACT.md, "Admission"): real process, real sockets.

The same answers tests/integration/test_admission.py checks in-process, here as a
sender sees them from the outside, with the process's own settings.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import autom_processes
from tests.support.service import SITE_SECRET, TG_SECRET, telegram_update, wait_until
from tests.support.telegram_stub import TelegramStub

STRIPE_SECRET = "whsec_e2e-stripe"


def site(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"id": f"form-{n}"}).encode()
    digest = hmac.new(SITE_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {"X-Signature": f"sha256={digest}", "Content-Type": "application/json"}


def stripe(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"id": f"evt_{n}", "type": "ping", "data": {}}).encode()
    t = int(time.time())
    digest = hmac.new(STRIPE_SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return body, {"Stripe-Signature": f"t={t},v1={digest}", "Content-Type": "application/json"}


def telegram(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(telegram_update(n, 7000 + n, "hello")).encode()
    return body, {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET, "Content-Type": "application/json"}


async def post(client: httpx.AsyncClient, source: str, delivery: tuple[bytes, dict[str, str]]) -> httpx.Response:
    body, headers = delivery
    return await client.post(f"/hooks/{source}", content=body, headers=headers)


async def events(db: Any, source: str) -> int:
    return int(await db.fetch_val("select count(*) from events where source = %s", [source]))


async def test_client_rate_refuses_an_hmac_sender_but_not_telegram_from_the_same_address(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, CLIENT_RATE="2")  # burst 4
        async with httpx.AsyncClient(base_url=proc.url) as client:
            answers = [await post(client, "site", site(n)) for n in range(10)]
            telegram_answers = [await post(client, "telegram", telegram(n)) for n in range(1, 11)]
            metrics = (await client.get("/metrics")).text
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    statuses = [r.status_code for r in answers]
    assert statuses[:4] == [202] * 4 and 429 in statuses, statuses
    for response in answers:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
    assert await events(db, "site") == statuses.count(202)  # nothing stored for the refused
    assert [r.status_code for r in telegram_answers] == [202] * 10
    assert 'autom_refusals_total{reason="rate",source="site"}' in metrics
    # one line for the burst, not one per refused request
    assert len(proc.logged("refusing site deliveries (rate)")) == 1


async def test_a_full_backlog_sheds_stripe_first_and_everyone_at_twice_the_cap(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    async def backlog(n: int) -> None:
        # unfinished jobs scheduled an hour ahead: no worker takes them meanwhile
        await db.execute("insert into jobs (kind, run_at) select 'e2e.filler', now() + interval '1 hour' "
                         "from generate_series(1, %s)", [n])

    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, MAX_PENDING_JOBS="20",
                                 STRIPE_WEBHOOK_SECRET=STRIPE_SECRET)
        async with httpx.AsyncClient(base_url=proc.url) as client:
            assert (await post(client, "stripe", stripe(1))).status_code == 202
            await backlog(25)

            async def stripe_refused() -> bool:
                return (await post(client, "stripe", stripe(2))).status_code == 503

            await wait_until(stripe_refused, timeout=15, interval=0.5)  # the estimate refreshes every second
            before = await events(db, "stripe")  # (a probe before the refresh may have been stored)
            response = await post(client, "stripe", stripe(3))
            assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
            assert await events(db, "stripe") == before
            assert (await post(client, "site", site(1))).status_code == 202
            assert (await post(client, "telegram", telegram(1))).status_code == 202

            await backlog(20)

            async def site_refused() -> bool:
                return (await post(client, "site", site(2))).status_code == 503

            await wait_until(site_refused, timeout=15, interval=0.5)
            before_all = {s: await events(db, s) for s in ("site", "telegram", "stripe")}
            for source, delivery in (("telegram", telegram(2)), ("site", site(3)), ("stripe", stripe(4))):
                assert (await post(client, source, delivery)).status_code == 503, source
            assert {s: await events(db, s) for s in ("site", "telegram", "stripe")} == before_all

            await db.execute("delete from jobs where kind = 'e2e.filler'")  # drained

            async def stripe_accepted() -> bool:
                return (await post(client, "stripe", stripe(5))).status_code == 202

            await wait_until(stripe_accepted, timeout=15, interval=0.5)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
