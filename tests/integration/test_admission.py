"""Admission over real HTTP against a real PostgreSQL (README: Sources, "Admission").

The app is served on 127.0.0.1 by hypercorn, as in production; the client is the
test, on real sockets. Refused deliveries are checked to have stored nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import httpx
import trio

from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from tests.support.http_app import (
    SITE_SECRET,
    STRIPE_SECRET,
    TELEGRAM_SECRET,
    RunningApp,
    app_settings,
    count_rows,
    running_app,
    sample,
)
from tests.support.service import wait_until


def site(n: int, secret: str = SITE_SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"id": f"form-{n}", "name": "x"}).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {"X-Signature": f"sha256={digest}", "Content-Type": "application/json"}


def stripe(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"id": f"evt_{n}", "type": "charge.succeeded", "data": {"object": {}}}).encode()
    t = int(time.time())
    digest = hmac.new(STRIPE_SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return body, {"Stripe-Signature": f"t={t},v1={digest}", "Content-Type": "application/json"}


def telegram(update_id: int, chat_id: int = 42, secret: str = TELEGRAM_SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": 1, "text": "hi", "chat": {"id": chat_id, "type": "private"}}}).encode()
    return body, {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}


async def post(app: RunningApp, source: str, delivery: tuple[bytes, dict[str, str]],
               headers: dict[str, str] | None = None) -> httpx.Response:
    body, base = delivery
    return await app.client.post(f"/hooks/{source}", content=body, headers={**base, **(headers or {})})


def refusals(app: RunningApp, reason: str, source: str) -> float:
    return sample(app.deps.metrics.refusals, reason=reason, source=source)


# --- the door ---------------------------------------------------------------------------


async def test_client_rate_answers_429_to_an_hmac_sender_while_telegram_from_the_same_address_passes(
    db: Any,
) -> None:
    async with running_app(db, app_settings(client_rate=2.0)) as app:  # burst 4
        answers = [await post(app, "site", site(n)) for n in range(8)]
        statuses = [r.status_code for r in answers]
        assert statuses[:4] == [202] * 4, statuses
        refused = [r for r in answers if r.status_code == 429]
        assert refused, statuses
        for response in refused:
            assert response.json() == {"error": "too many requests, try again later"}
            assert response.headers["retry-after"].isdigit() and int(response.headers["retry-after"]) >= 1
            assert response.headers["connection"] == "close"
        assert await count_rows(db, "events") == statuses.count(202)
        # Telegram, proven by its secret header, is not limited by address
        for update_id in range(1, 21):
            assert (await post(app, "telegram", telegram(update_id))).status_code == 202
        assert refusals(app, "rate", "site") == len(refused)
        metrics = (await app.client.get("/metrics")).text
        assert 'autom_refusals_total{reason="rate",source="site"}' in metrics


async def test_a_client_failing_verification_is_refused_before_its_body_is_read(db: Any) -> None:
    async with running_app(db) as app:
        for n in range(21):  # more than 20 failures within 10 s
            assert (await post(app, "site", site(n, secret="wrong"))).status_code == 401
        # now even a rightly signed delivery is refused, for a minute
        response = await post(app, "site", site(100))
        assert response.status_code == 429
        assert 55 <= int(response.headers["retry-after"]) <= 60
        assert response.json() == {"error": "too many failed deliveries, try again later"}
        assert await count_rows(db, "events") == 0
        # unknown sources still get their 404 (first in the contract's order)
        assert (await app.client.post("/hooks/nope", content=b"{}")).status_code == 404
        # a Telegram delivery proven by its header is not held against the address
        assert (await post(app, "telegram", telegram(1))).status_code == 202
        assert refusals(app, "failing_client", "site") == 1


async def test_bad_telegram_secrets_are_refused_at_the_door_and_count_as_failures(db: Any) -> None:
    async with running_app(db) as app:
        for n in range(21):
            response = await post(app, "telegram", telegram(n, secret="wrong"))
            assert response.status_code == 401 and response.json() == {"error": "verification failed"}
        response = await post(app, "telegram", telegram(99, secret="wrong"))
        assert response.status_code == 429
        assert await count_rows(db, "events") == 0
        assert (await post(app, "telegram", telegram(100))).status_code == 202


async def test_unknown_sources_count_as_failures(db: Any) -> None:
    async with running_app(db) as app:
        for _ in range(21):
            assert (await app.client.post("/hooks/wp-login", content=b"x")).status_code == 404
        assert (await post(app, "site", site(1))).status_code == 429


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket(db: Any) -> None:
    async with running_app(db, app_settings(client_rate=1.0, trusted_proxies="127.0.0.1/32")) as app:  # burst 2
        a = [await post(app, "site", site(n), {"X-Forwarded-For": "198.51.100.1"}) for n in range(3)]
        b = [await post(app, "site", site(10 + n), {"X-Forwarded-For": "198.51.100.2"}) for n in range(2)]
        assert [r.status_code for r in a] == [202, 202, 429]
        assert [r.status_code for r in b] == [202, 202]


async def test_an_untrusted_peer_cannot_pick_its_bucket_with_x_forwarded_for(db: Any) -> None:
    async with running_app(db, app_settings(client_rate=1.0)) as app:  # no TRUSTED_PROXIES
        answers = [await post(app, "site", site(n), {"X-Forwarded-For": f"198.51.100.{n}"}) for n in range(3)]
        assert [r.status_code for r in answers] == [202, 202, 429]


async def test_a_body_that_does_not_arrive_within_the_deadline_gets_408_and_the_connection_closes(db: Any) -> None:
    async with running_app(db) as app:
        app.app.asgi_app.body_deadline = 0.5  # the door (10 s in production)
        stream = await trio.open_tcp_stream("127.0.0.1", app.port)
        async with stream:
            body, headers = site(1)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            await stream.send_all(
                f"POST /hooks/site HTTP/1.1\r\nHost: t\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:5]
            )
            received = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some(65536):
                    received += chunk
            # the server answered and closed (receive_some returned b"")
        assert received.startswith(b"HTTP/1.1 408")
        assert b"connection: close" in received.lower()
        assert await count_rows(db, "events") == 0
        assert refusals(app, "slow_body", "site") == 1
        # others are served meanwhile and after
        assert (await post(app, "site", site(2))).status_code == 202


# --- the backlog and recipients ---------------------------------------------------------


async def _enqueue(db: Any, n: int, recipient: str | None = None) -> None:
    await JobStore(db).enqueue_many([NewJob("backlog.filler", {"n": i}, recipient=recipient) for i in range(n)])


async def _estimate_reaches(app: RunningApp, n: int) -> None:
    admission = app.app.extensions["autom.admission"]
    await wait_until(lambda: admission.backlog >= n, timeout=10)


async def test_a_full_backlog_sheds_only_senders_that_retry_then_everyone_then_nobody(db: Any) -> None:
    settings = app_settings(max_pending_jobs=10)
    async with running_app(db, settings) as app:
        await _enqueue(db, 10)
        await _estimate_reaches(app, 10)
        events = await count_rows(db, "events")
        response = await post(app, "stripe", stripe(1))
        assert response.status_code == 503
        assert response.headers["retry-after"].isdigit()
        assert await count_rows(db, "events") == events  # nothing stored for it
        # senders that do not retry are still stored; their jobs wait
        assert (await post(app, "site", site(1))).status_code == 202
        assert (await post(app, "telegram", telegram(1))).status_code == 202
        # at twice the cap, everyone gets 503
        await _enqueue(db, 10)
        await _estimate_reaches(app, 20)
        for source, delivery in (("site", site(2)), ("telegram", telegram(2)), ("stripe", stripe(2))):
            response = await post(app, source, delivery)
            assert response.status_code == 503, source
            assert int(response.headers["retry-after"]) >= 1
        assert refusals(app, "backlog", "stripe") == 2 and refusals(app, "backlog", "site") == 1
        # drained: 202 again
        await db.execute("update jobs set status = 'done', finished_at = now()")
        await wait_until(lambda: app.app.extensions["autom.admission"].backlog == 0, timeout=10)
        assert (await post(app, "stripe", stripe(3))).status_code == 202


async def test_a_recipient_at_its_cap_gets_429_while_others_are_accepted(db: Any) -> None:
    async with running_app(db, app_settings(max_pending_per_recipient=4)) as app:
        answers = [await post(app, "telegram", telegram(n, chat_id=42)) for n in range(1, 7)]
        assert [r.status_code for r in answers] == [202, 202, 202, 202, 429, 429]
        assert answers[4].headers["retry-after"].isdigit()
        assert (await post(app, "telegram", telegram(50, chat_id=43))).status_code == 202
        assert await db.fetch_val("select count(*) from jobs where recipient = '42'") == 4
        assert refusals(app, "recipient", "telegram") == 2
        # one of its jobs finishes: room for one more
        await db.execute("update jobs set status = 'done', finished_at = now() "
                         "where id = (select min(id) from jobs where recipient = '42')")
        assert (await post(app, "telegram", telegram(7, chat_id=42))).status_code == 202


async def test_a_recipient_filled_by_another_replica_is_found_by_the_refresh(db: Any) -> None:
    async with running_app(db, app_settings(max_pending_per_recipient=4)) as app:
        await _enqueue(db, 4, recipient="42")  # not through this process
        await _estimate_reaches(app, 4)
        assert (await post(app, "telegram", telegram(1, chat_id=42))).status_code == 429
        assert (await post(app, "telegram", telegram(2, chat_id=43))).status_code == 202
