"""/health says "degraded" (still 200) when alerts do not get out; /metrics counts unsent alerts.

Made to happen for real: the Telegram stub refuses the alert chat ("chat not
found") and then accepts it again, against the real service; an alert left unsent
for longer than a few minutes is a row written as the failure trigger writes it.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from autom.alerts import HELD_SECONDS, STALE_SECONDS
from tests.support.http_app import running_app
from tests.support.service import ALERT_CHAT, running_service, service_settings, wait_until
from tests.support.telegram_stub import Reply, TelegramStub


async def health_status(client: httpx.AsyncClient, wanted: str) -> dict[str, Any] | None:
    response = await client.get("/health")
    assert response.status_code == 200, response.text  # degraded is still 200: the process works
    body = dict(response.json())
    return body if body["status"] == wanted else None


def unsent_metric(text: str) -> float:
    found = re.search(r"^autom_alerts_unsent (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


async def test_degraded_while_the_alert_chat_refuses_and_ok_once_it_accepts(dsn, db, telegram_stub: TelegramStub):
    refusal = Reply(status=400, description="Bad Request: chat not found")
    telegram_stub.plan("sendMessage", [refusal, refusal], chat_id=ALERT_CHAT)
    async with (
        running_service(service_settings(dsn, telegram_stub.url)) as service,
        httpx.AsyncClient(base_url=service.urls[0], timeout=5) as client,
    ):
        first = await health_status(client, "ok")
        assert first is not None and first["alerts"] == {"unsent": 0}
        # a job that failed for good, as the trigger records it
        await db.execute("insert into alerts (job_id, kind, attempts, error) values (41, 'x.kind', 1, 'boom')")
        degraded = await wait_until(lambda: health_status(client, "degraded"), timeout=20, interval=0.1)
        [problem] = degraded["alerts"]["problems"]
        assert problem.startswith("the last alert could not be delivered: ") and "chat not found" in problem
        assert "TEST-token" not in problem
        # the refusals run out, the outbox sends it again: ok, nothing unsent (the success is
        # noted just before the row is marked sent, so wait for both)

        async def ok_and_sent() -> dict[str, Any] | None:
            body = await health_status(client, "ok")
            return body if body and body["alerts"] == {"unsent": 0} else None

        await wait_until(ok_and_sent, timeout=30, interval=0.1)
        assert await db.fetch_val("select count(*) from alerts where sent_at is null") == 0
    assert len(telegram_stub.messages(ALERT_CHAT)) == 3  # two refused, one accepted


async def test_alerts_waiting_longer_than_a_few_minutes_make_it_degraded_and_are_counted(db):
    async with running_app(db) as app:
        assert (await health_status(app.client, "ok"))["alerts"] == {"unsent": 0}
        # one fresh unsent alert: on its way, not a problem; one waiting past STALE_SECONDS is
        await db.execute("insert into alerts (job_id, kind, attempts, error) values (1, 'x.kind', 1, 'fresh')")
        assert (await health_status(app.client, "ok"))["alerts"] == {"unsent": 1}
        await db.execute(
            "insert into alerts (job_id, kind, attempts, error, created_at) "
            "values (2, 'x.kind', 1, 'old', now() - make_interval(secs => %s))", [STALE_SECONDS + 60])
        body = await health_status(app.client, "degraded")
        assert body is not None and body["database"] == "ok"
        assert body["alerts"] == {"unsent": 2, "problems": ["1 alert(s) unsent for over 5 minutes"]}
        assert unsent_metric((await app.client.get("/metrics")).text) == 2


async def test_alerts_held_back_past_a_few_seconds_make_it_degraded_until_they_are_sent(db):
    async with running_app(db) as app:
        await db.execute(
            "insert into alerts (job_id, kind, attempts, error, created_at) "
            "values (3, 'x.kind', 1, 'held', now() - make_interval(secs => %s))", [HELD_SECONDS + 5])
        body = await health_status(app.client, "degraded")
        assert body is not None and body["alerts"]["unsent"] == 1
        [problem] = body["alerts"]["problems"]
        assert problem.startswith("1 alert(s) held back for over 15 s (the alert chat's limit or the throttle)")
        assert "/ui/jobs?status=failed" in problem
        await db.execute("update alerts set sent_at = now(), sent_as = 'summary'")
        assert (await health_status(app.client, "ok"))["alerts"] == {"unsent": 0}
