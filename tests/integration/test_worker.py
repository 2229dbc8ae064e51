"""The worker pool inside the running service: Telegram stub at the network edge, real PostgreSQL."""

from __future__ import annotations

import httpx
import trio

from autom.jobs.models import NewJob
from tests.support.service import (
    ALERT_CHAT,
    post_telegram,
    running_service,
    service_settings,
    telegram_update,
    wait_until,
)
from tests.support.telegram_stub import Reply


async def job_row(db, job_id):
    return await db.fetch_one("select status, attempts, last_error, run_at from jobs where id = %s", [job_id])


async def test_ping_gets_pong_end_to_end(dsn, db, telegram_stub):
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            response = await post_telegram(client, telegram_update(1, 42, "/ping"))
            assert response.status_code == 202
            body = response.json()
            assert body["jobs"] == 1
        with trio.fail_after(10):
            calls = await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=42)
        assert calls[0].params["text"] == "pong"
        await wait_until(lambda: db.fetch_val("select count(*) from jobs where status = 'done'"))
        row = await db.fetch_one("select status, attempts, recipient from jobs")
        assert dict(row) == {"status": "done", "attempts": 1, "recipient": "42"}


async def test_502_once_is_retried_and_delivered_on_attempt_2(dsn, db, telegram_stub):
    telegram_stub.plan("sendMessage", [Reply(502)], chat_id=7)
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            job_id = (await post_telegram(client, telegram_update(2, 7, "/ping"))).json()["id"]
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs"))
    row = await db.fetch_one("select status, attempts, last_error from jobs where event_id = %s", [job_id])
    assert row["status"] == "done" and row["attempts"] == 2
    assert row["last_error"] is None  # a done job keeps no last_error; its first attempt keeps its own
    first = await db.fetch_val("select a.error from job_attempts a join jobs j on j.id = a.job_id "
                               "where j.event_id = %s", [job_id])
    assert "502" in first
    assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage", chat_id=7)] == ["pong", "pong"]


async def test_429_retry_after_is_waited_out(dsn, db, telegram_stub):
    telegram_stub.plan("sendMessage", [Reply(429, retry_after=1.5)], chat_id=8)
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            await post_telegram(client, telegram_update(3, 8, "/ping"))
        with trio.fail_after(10):
            calls = await telegram_stub.wait_for_calls(2, method="sendMessage", chat_id=8)
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs"))
    assert calls[1].time - calls[0].time >= 1.4
    # a 429 is Telegram's limit, not a failure: the attempt is given back (autom/limits.py)
    assert await db.fetch_val("select attempts from jobs") == 1


async def test_400_fails_after_one_attempt_with_exactly_one_alert(dsn, db, telegram_stub):
    telegram_stub.plan("sendMessage", [Reply(400, description="Bad Request: chat not found")], chat_id=9)
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            await post_telegram(client, telegram_update(4, 9, "/ping"))
        job_id = await wait_until(lambda: db.fetch_val("select id from jobs where status = 'failed'"))
        with trio.fail_after(10):
            alerts = await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)
        await trio.sleep(0.5)  # give a second (wrong) alert the chance to show up
    row = await job_row(db, job_id)
    assert row["attempts"] == 1 and "chat not found" in row["last_error"]
    alerts = telegram_stub.messages(chat_id=ALERT_CHAT)
    assert len(alerts) == 1
    assert f"job {job_id}" in alerts[0]["text"] and "telegram.message" in alerts[0]["text"]
    assert "chat not found" in alerts[0]["text"]


async def test_unknown_kind_fails_permanently_with_an_alert(dsn, db, telegram_stub):
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        job_id = await svc.deps.store.enqueue(NewJob("no.such.kind"))
        svc.deps.doorbell.set()
        await wait_until(lambda: db.fetch_val("select status = 'failed' from jobs"))
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)
    row = await job_row(db, job_id)
    assert row["attempts"] == 1 and "no handler for kind 'no.such.kind'" in row["last_error"]


async def test_a_hanging_api_times_out_while_other_chats_are_served(dsn, db, telegram_stub):
    telegram_stub.plan("sendMessage", [Reply(hang=True)], chat_id=100)
    settings = service_settings(dsn, telegram_stub.url, http_timeout_seconds=1.0)
    async with running_service(settings) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            await post_telegram(client, telegram_update(10, 100, "/ping"))
            with trio.fail_after(5):
                await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=100)
            started = trio.current_time()
            for i, chat in enumerate((101, 102, 103)):
                await post_telegram(client, telegram_update(11 + i, chat, "/ping"))
            with trio.fail_after(5):
                for chat in (101, 102, 103):
                    await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=chat)
            # the others were answered while chat 100's call still hung
            assert trio.current_time() - started < 1.0
        await wait_until(lambda: db.fetch_val("select count(*) = 4 from jobs where status = 'done'"))
    row = await db.fetch_one("select id, attempts, last_error from jobs where recipient = '100'")
    assert row["attempts"] == 2 and row["last_error"] is None  # done: its first attempt keeps the error
    assert "deadline" in await db.fetch_val("select error from job_attempts where job_id = %s", [row["id"]])


async def test_fairness_a_lone_chat_is_served_within_a_few_claims(dsn, db, telegram_stub):
    settings = service_settings(dsn, telegram_stub.url)
    async with running_service(settings, handlers={}) as svc:
        pass  # migrate only
    from autom.jobs.store import JobStore

    store = JobStore(db)
    await store.enqueue_many([
        NewJob("telegram.message", {"chat_id": 500, "text": "/ping"}, recipient="500") for _ in range(300)
    ])
    await store.enqueue(NewJob("telegram.message", {"chat_id": 501, "text": "/ping"}, recipient="501"))
    async with running_service(settings) as svc:
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=501)
        position = [c.params["chat_id"] for c in telegram_stub.calls_of("sendMessage")].index(501)
        assert position <= 3
        assert svc is not None


async def test_graceful_stop_lets_a_running_job_finish(dsn, db, telegram_stub):
    telegram_stub.plan("sendMessage", [Reply(delay=1.5)], chat_id=200)
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            await post_telegram(client, telegram_update(20, 200, "/ping"))
        with trio.fail_after(5):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=200)
        svc.control.request_stop()
    row = await db.fetch_one("select status, attempts from jobs")
    assert dict(row) == {"status": "done", "attempts": 1}


async def test_hard_deadline_puts_the_job_back_without_counting_the_attempt(dsn, db, telegram_stub):
    telegram_stub.plan("sendMessage", [Reply(hang=True)], chat_id=300)
    settings = service_settings(dsn, telegram_stub.url, shutdown_grace_seconds=0.5, http_timeout_seconds=30)
    async with running_service(settings) as svc:
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            await post_telegram(client, telegram_update(30, 300, "/ping"))
        with trio.fail_after(5):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=300)
        stopping = trio.current_time()
        svc.control.request_stop()
    assert trio.current_time() - stopping < 3
    row = await db.fetch_one("select status, attempts, locked_until from jobs")
    assert (row["status"], row["attempts"]) == ("pending", 0)
    telegram_stub.release()


async def test_schedule_two_replicas_make_one_job_per_slot(dsn, db, telegram_stub):
    from autom.schedule import Schedule

    settings = service_settings(dsn, telegram_stub.url)
    schedules = [Schedule("heartbeat", every_minutes=60), Schedule("heartbeat2", every_minutes=1)]
    handlers = {"heartbeat": __import__("autom.handlers.heartbeat", fromlist=["handle"]).handle}
    async with running_service(settings, schedules=schedules, handlers=handlers), \
            running_service(settings, schedules=schedules, handlers=handlers):
        await wait_until(lambda: db.fetch_val("select count(*) from jobs where kind = 'heartbeat' and status = 'done'"))
    keys = [r["key"] for r in await db.fetch_all("select key from jobs where kind = 'heartbeat'")]
    assert len(keys) == 1 and keys[0].startswith("heartbeat:")
    assert await db.fetch_val("select value->>'job_id' from service_state where name = 'heartbeat'") is not None
