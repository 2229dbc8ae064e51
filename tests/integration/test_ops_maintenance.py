"""Watchdog alerts (lag, heartbeat) and retention, against a real database and the Bot API stub."""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo

import trio

from autom.app import Registry
from autom.config import Settings
from autom.context import Services, new_context
from autom.deps import Deps
from autom.handlers.prune import handle as prune
from autom.jobs.models import Job, NewJob
from autom.jobs.store import JobStore
from autom.schedule import Schedule
from autom.telegram import open_telegram
from autom.watchdog import Watchdog
from autom.worker.run import Run
from tests.support.service import ALERT_CHAT, service_settings


def deps_for(settings: Settings, db, telegram) -> Deps:
    return Deps(settings=settings, db=db, store=JobStore(db), sources={}, telegram=telegram)


async def test_queue_lag_alerts_once_when_it_starts_and_once_when_it_clears(dsn, db, telegram_stub):
    settings = service_settings(dsn, telegram_stub.url, queue_lag_alert_seconds=5)
    async with open_telegram(settings) as telegram:
        replicas = [Watchdog(deps_for(settings, db, telegram), schedules=()) for _ in range(2)]
        for dog in replicas:
            assert (await dog.check())["queue_lag"] is False
        assert telegram_stub.messages(ALERT_CHAT) == []  # a quiet start says nothing

        job_id = await JobStore(db).enqueue(NewJob("k"))
        await db.execute("update jobs set run_at = now() - interval '10 minutes' where id = %s", [job_id])
        for _ in range(3):
            for dog in replicas:
                assert (await dog.check())["queue_lag"] is True
        texts = [m["text"] for m in telegram_stub.messages(ALERT_CHAT)]
        assert len(texts) == 1 and "queue lag is 600s" in texts[0]

        await db.execute("update jobs set status = 'done', finished_at = now() where id = %s", [job_id])
        for _ in range(2):
            for dog in replicas:
                assert (await dog.check())["queue_lag"] is False
        texts = [m["text"] for m in telegram_stub.messages(ALERT_CHAT)]
        assert len(texts) == 2 and "back to normal" in texts[1]


async def test_silent_heartbeat_alerts_once_and_clears_once(dsn, db, telegram_stub):
    settings = service_settings(dsn, telegram_stub.url)
    schedules = [Schedule("heartbeat", every_minutes=1)]
    async with open_telegram(settings) as telegram:
        dog = Watchdog(deps_for(settings, db, telegram), schedules)
        assert (await dog.check())["heartbeat"] is False  # no beat yet, but the service just started
        await db.execute(
            "insert into service_state (name, updated_at) values ('heartbeat', now() - interval '3 minutes')")
        assert (await dog.check())["heartbeat"] is True
        assert (await dog.check())["heartbeat"] is True
        await db.execute("update service_state set updated_at = now() where name = 'heartbeat'")
        assert (await dog.check())["heartbeat"] is False
    texts = [m["text"] for m in telegram_stub.messages(ALERT_CHAT)]
    assert len(texts) == 2
    assert "no heartbeat for 3 min" in texts[0] and "heartbeat is back" in texts[1]


async def test_no_heartbeat_since_the_start_alerts_once_its_period_has_passed_twice(dsn, db, telegram_stub):
    # the watchdog's clock is injected: the service "runs" for three minutes without a sleep
    settings = service_settings(dsn, telegram_stub.url)
    now = [1_000_000.0]
    async with open_telegram(settings) as telegram:
        dog = Watchdog(deps_for(settings, db, telegram), [Schedule("heartbeat", every_minutes=1)], clock=lambda: now[0])
        assert (await dog.check())["heartbeat"] is False
        now[0] += 110  # under two periods
        assert (await dog.check())["heartbeat"] is False
        now[0] += 70
        assert (await dog.check())["heartbeat"] is True
    texts = [m["text"] for m in telegram_stub.messages(ALERT_CHAT)]
    assert len(texts) == 1 and "no heartbeat for 3 min" in texts[0]


async def test_a_weekday_cron_heartbeat_is_not_silent_over_the_weekend(dsn, db, telegram_stub):
    # before: any cron heartbeat counted as daily, so Friday's beat alarmed on Sunday
    settings = service_settings(dsn, telegram_stub.url)
    berlin = ZoneInfo("Europe/Berlin")
    friday = datetime(2026, 12, 4, 9, 0, 5, tzinfo=berlin)
    await db.execute("insert into service_state (name, updated_at) values ('heartbeat', %s)", [friday])
    now = [datetime(2026, 12, 6, 10, 0, tzinfo=berlin).timestamp()]  # Sunday
    async with open_telegram(settings) as telegram:
        dog = Watchdog(deps_for(settings, db, telegram), [Schedule("heartbeat", cron="0 9 * * 1-5")],
                       tz=berlin, clock=lambda: now[0])
        assert (await dog.check())["heartbeat"] is False
        now[0] = datetime(2026, 12, 8, 8, 59, tzinfo=berlin).timestamp()  # Tuesday, before its slot
        assert (await dog.check())["heartbeat"] is False
        now[0] = datetime(2026, 12, 8, 9, 1, tzinfo=berlin).timestamp()  # Monday's and Tuesday's missed
        assert (await dog.check())["heartbeat"] is True
    texts = [m["text"] for m in telegram_stub.messages(ALERT_CHAT)]
    assert len(texts) == 1 and "(expected cron 0 9 * * 1-5)" in texts[0]


async def test_prune_removes_what_it_should_and_keeps_what_it_must(dsn, db, telegram_stub):
    settings = service_settings(dsn, telegram_stub.url)
    store = JobStore(db)

    async def event(age_days: float) -> int:
        return await db.fetch_val(
            "insert into events (source, body, received_at) values ('site', '{}', now() - %s * interval '1 day')"
            " returning id", [age_days])

    async def job(status: str, age_days: float, *, key=None, event_id=None) -> int:
        job_id = await store.enqueue(NewJob("k", key=key, event_id=event_id))
        await db.execute(
            "update jobs set status = %s, finished_at = case when %s in ('done', 'failed') then now() - "
            "%s * interval '1 day' end, created_at = now() - %s * interval '1 day' where id = %s",
            [status, status, age_days, age_days, job_id])
        return job_id

    old_event_done = await event(40)
    old_event_failed = await event(40)
    old_event_alone = await event(40)
    new_event = await event(1)
    old_done = await job("done", 10, event_id=old_event_done)
    new_done = await job("done", 2)
    old_failed = await job("failed", 60, event_id=old_event_failed)
    old_pending = await job("pending", 60)
    slot_job = await job("done", 7.5, key="heartbeat:2026-11-22T10:00Z")  # past retention, key still kept
    old_slot_job = await job("done", 9, key="heartbeat:2026-11-20T10:00Z")

    async def alert(sent_days_ago: float | None) -> int:
        return await db.fetch_val(
            "insert into alerts (job_id, kind, attempts, error, created_at, sent_at) values (0, 'k', 1, 'e', "
            "now() - interval '30 days', now() - %s * interval '1 day') returning id", [sent_days_ago])

    old_sent_alert = await alert(10)  # past RETAIN_DONE_DAYS (7)
    new_sent_alert = await alert(1)
    unsent_alert = await alert(None)  # never pruned: it still has to reach someone

    async def once_key(key: str, age_days: float) -> None:
        await db.execute("insert into autom_once (key, job_id, recorded_at) values (%s, 0, "
                         "now() - %s * interval '1 day')", [key, age_days])

    await once_key("crm:old", 31)  # past the longer retention (RETAIN_EVENTS_DAYS, 30)
    await once_key("crm:kept", 20)  # past RETAIN_DONE_DAYS only: its event may still be replayed

    async with open_telegram(settings) as telegram:
        fake = Job(id=0, kind="maintenance.prune", payload={}, attempts=1, max_attempts=1, lease=1,
                   locked_until=None)  # type: ignore[arg-type]
        services = Services(settings=settings, db=db, telegram=telegram, http=None,
                            registry=Registry(handlers={}, sources={}))
        ctx = new_context(Run(fake, math.inf, None), services)
        await prune(ctx, fake)
        await prune(ctx, fake)  # a rerun is harmless

    jobs = {r["id"] for r in await db.fetch_all("select id from jobs")}
    assert jobs == {new_done, old_failed, old_pending, slot_job}
    assert old_done not in jobs and old_slot_job not in jobs
    events = {r["id"] for r in await db.fetch_all("select id from events")}
    # the done job's event went with the job; the failed job's stays for a replay
    assert events == {old_event_failed, new_event}
    assert old_event_alone not in events and old_event_done not in events
    alerts = {r["id"] for r in await db.fetch_all("select id from alerts where job_id = 0")}
    assert alerts == {new_sent_alert, unsent_alert} and old_sent_alert not in alerts
    assert [r["key"] for r in await db.fetch_all("select key from autom_once")] == ["crm:kept"]
    await trio.lowlevel.checkpoint()


async def test_pruning_recipients_skips_rows_others_hold_instead_of_waiting_for_them(db):
    """prune_recipients deadlocked with multi-recipient enqueues under stress (issue 11):
    it now takes its rows in a fixed order and skips the ones another transaction holds."""
    from autom.db.queries import Q

    await db.execute("insert into recipients (recipient) select 'idle-' || g from generate_series(1, 5) g")
    held, done = trio.Event(), trio.Event()

    async def holder() -> None:
        async with db.transaction() as tx:  # an enqueue for idle-3 in flight
            await tx.execute("select 1 from recipients where recipient = 'idle-3' for update")
            held.set()
            await done.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        await held.wait()
        with trio.fail_after(5):
            deleted = await db.execute(Q.prune_recipients, {"batch": 100})
        done.set()
    assert deleted == 4
    assert [r["recipient"] for r in await db.fetch_all("select recipient from recipients")] == ["idle-3"]
