"""The alert outbox: recorded with the failure, sent by the service, throttled, once per alert.

Real PostgreSQL, the real service (``running_service``) and the Telegram stub; the
kill cases with the real process are in tests/e2e/test_alert_outbox_kill.py.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from autom.errors import PermanentError, TransientError
from autom.jobs.models import NewJob
from autom.jobs.retry import RetryPolicy
from autom.jobs.store import JobStore
from autom.ops import Operations
from tests.support.queue import claim_one, complete, fail
from tests.support.restartable_pg import RestartablePg, restartable_pg
from tests.support.service import ALERT_CHAT, running_service, service_settings, wait_until
from tests.support.telegram_stub import Reply, TelegramStub

_NAMED = re.compile(r"^autom: job (\d+) \(")
_SUMMARY = re.compile(r"^autom: (\d+) jobs? failed for good, too many at once")
_SUMMARY_IDS = re.compile(r": jobs? ([\d, ]+)(?:, … and \d+ more)?\. All of them")


async def alert_rows(db: Any) -> list[dict[str, Any]]:
    return await db.fetch_all("select * from alerts order by id")


def alert_texts(stub: TelegramStub) -> list[str]:
    return [str(m["text"]) for m in stub.messages(ALERT_CHAT)]


def every_named(texts: list[str]) -> list[int]:
    """Every job id the messages name: singles and the ids listed in summaries."""
    named = [int(m.group(1)) for t in texts if (m := _NAMED.match(t))]
    for text in texts:
        if _SUMMARY.match(text):
            listed = _SUMMARY_IDS.search(text)
            assert listed is not None, text
            named += [int(n) for n in listed.group(1).split(", ")]
    return named


def named_and_summarised(texts: list[str]) -> tuple[list[int], list[int]]:
    """Job ids named by single alerts, and the counts of the summaries."""
    named = [int(m.group(1)) for t in texts if (m := _NAMED.match(t))]
    counts = [int(m.group(1)) for t in texts if (m := _SUMMARY.match(t))]
    assert len(named) + len(counts) == len(texts), texts  # nothing else was sent
    return named, counts


async def metric(client: httpx.AsyncClient, outcome: str) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(rf'^autom_alerts_total{{outcome="{outcome}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def all_sent(db: Any, count: int) -> bool:
    row = await db.fetch_one("select count(*) as n, count(sent_at) as sent from alerts")
    return row is not None and row["n"] == count and row["sent"] == count


# --- recorded with the failure ----------------------------------------------------------------


async def test_failing_for_good_records_the_alert_in_the_same_statement(db: Any) -> None:
    store = JobStore(db, retry=RetryPolicy(base=0.01, cap=0.01))
    await store.enqueue_many([NewJob("a.kind", max_attempts=2), NewJob("b.kind")])
    first, second = sorted(await store.claim(2), key=lambda job: job.id)
    # a retry is no alert; the last attempt and a permanent error are
    assert not (await fail(store, first, TransientError("502"))).final
    assert await alert_rows(db) == []
    assert (await fail(store, second, PermanentError("400 chat not found"))).final
    again = await wait_until(lambda: claim_one(store))
    assert (await fail(store, again, TransientError("502 again"))).final
    rows = await alert_rows(db)
    assert [(r["job_id"], r["kind"], r["attempts"], r["error"], r["sent_at"]) for r in rows] == [
        (second.id, "b.kind", 1, "PermanentError: 400 chat not found", None),
        (first.id, "a.kind", 2, "TransientError: 502 again", None),
    ]
    # a job retried by an operator that fails again alerts again; finishing never does
    await Operations(db).retry_job(second.id)
    retried = await claim_one(store)
    assert retried is not None and await complete(store, retried)
    assert len(await alert_rows(db)) == 2


# --- sent by the service ----------------------------------------------------------------------


async def test_an_alert_waits_out_a_telegram_outage_and_arrives_once(dsn: str, db: Any,
                                                                     telegram_stub: TelegramStub) -> None:
    telegram_stub.plan("sendMessage", [Reply(502), Reply(502), Reply(429, retry_after=1)], chat_id=ALERT_CHAT)
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc:
        job_id = await svc.deps.store.enqueue(NewJob("no.such.kind"))
        svc.deps.doorbell.set()
        assert await wait_until(lambda: all_sent(db, 1), timeout=30)
        await trio.sleep(0.5)  # a second (wrong) delivery would show up by now
        async with httpx.AsyncClient(base_url=svc.urls[0]) as client:
            failed, sent = await metric(client, "failed"), await metric(client, "sent")
    calls = telegram_stub.calls_of("sendMessage", chat_id=ALERT_CHAT)
    assert len(calls) == 4  # 502, 502, 429, then delivered
    assert calls[3].time - calls[2].time >= 0.9  # the 429's retry_after was waited out
    texts = alert_texts(telegram_stub)
    assert all(t == texts[0] for t in texts)
    # a job no handler ran gives its attempt back (1f2adfc): "after 0 attempts"
    assert re.match(rf"autom: job {job_id} \(no\.such\.kind\) failed after [01] attempts?: ", texts[0]), texts[0]
    row = (await alert_rows(db))[0]
    assert (row["tries"], row["sent_as"], row["claimed_until"]) == (3, "single", None)
    assert (failed, sent) == (3, 1)


async def test_a_burst_of_50_failures_is_an_alert_and_a_summary_naming_the_rest(dsn: str, db: Any,
                                                                                 telegram_stub: TelegramStub) -> None:
    # the alert chat is a group (20 a minute, one every 3 s): the first failure goes alone,
    # the rest wait for the chat's next turn and go out in one summary that names them
    ids = await JobStore(db).enqueue_many([NewJob("no.such.kind") for _ in range(45)] +
                                          [NewJob("other.kind") for _ in range(5)])
    async with running_service(service_settings(dsn, telegram_stub.url)):
        assert await wait_until(lambda: all_sent(db, 50), timeout=30)
        await trio.sleep(0.5)
    texts = alert_texts(telegram_stub)
    named, summaries = named_and_summarised(texts)
    assert len(named) + sum(summaries) == 50 and len(summaries) == 1 and len(texts) <= 3, texts
    assert sorted(every_named(texts)) == sorted(ids)  # each failed job named once
    summary = next(t for t in texts if _SUMMARY.match(t))
    kinds = {"no.such.kind": 45, "other.kind": 5}
    for kind in kinds:
        kinds[kind] -= sum(1 for t in texts if _NAMED.match(t) and f"({kind})" in t)
    for kind, count in kinds.items():
        if count:
            assert f"{kind}: {count}" in summary, summary
    assert "/ui/jobs?status=failed" in summary and f"`autom failed --limit {summaries[0]}`" in summary
    calls = telegram_stub.calls_of("sendMessage", chat_id=ALERT_CHAT)
    assert all(b.time - a.time >= 3 - 0.3 for a, b in itertools.pairwise(calls))  # a group's turns
    rows = await alert_rows(db)
    assert sorted(r["job_id"] for r in rows if r["sent_as"] == "single") == sorted(named)
    assert sum(1 for r in rows if r["sent_as"] == "summary") == summaries[0]


async def test_60_failures_within_a_minute_reach_a_group_in_at_most_20_messages_naming_all(
    dsn: str, db: Any, telegram_stub: TelegramStub
) -> None:
    """Two replicas fail 60 jobs in three waves within a minute; their alerts together keep
    to the group's 20 messages a minute (one every 3 s) and name every job."""
    settings = service_settings(dsn, telegram_stub.url)
    ids: list[int] = []
    async with running_service(settings) as one, running_service(settings) as two:
        for wave, svc in enumerate((one, two, one)):
            ids += await svc.deps.store.enqueue_many([NewJob(f"wave{wave}.kind") for _ in range(20)])
            svc.deps.doorbell.set()
            assert await wait_until(partial(_failed, db, len(ids)), timeout=20)
            await trio.sleep(4)  # the next wave a turn of the alert chat later
        assert await wait_until(lambda: all_sent(db, 60), timeout=120)
    texts = alert_texts(telegram_stub)
    assert len(texts) <= 20, texts
    assert sorted(every_named(texts)) == sorted(ids)  # every failed job named, once
    calls = telegram_stub.calls_of("sendMessage", chat_id=ALERT_CHAT)
    assert all(b.time - a.time >= 3 - 0.3 for a, b in itertools.pairwise(calls)), \
        [round(b.time - a.time, 2) for a, b in itertools.pairwise(calls)]


async def _failed(db: Any, count: int) -> bool:
    return int(await db.fetch_val("select count(*) from jobs where status = 'failed'")) >= count


async def test_two_replicas_send_each_alert_once(dsn: str, db: Any, telegram_stub: TelegramStub) -> None:
    settings = service_settings(dsn, telegram_stub.url)
    async with running_service(settings) as one, running_service(settings):
        # failures by both replicas' workers ...
        worked = await one.deps.store.enqueue_many([NewJob("no.such.kind") for _ in range(8)])
        one.deps.doorbell.set()
        # ... and failures recorded by a replica that is gone (nobody rings for these:
        # both senders find them at once when they are ORPHAN_SECONDS old)
        later = datetime.now(UTC) + timedelta(hours=1)  # not claimable: nobody here runs them
        orphans = await JobStore(db).enqueue_many([NewJob("gone.kind", run_at=later) for _ in range(6)])
        await db.execute("update jobs set status = 'failed', last_error = 'replica died' where id = any(%s)",
                         [orphans])
        assert await wait_until(lambda: all_sent(db, 14), timeout=40)
        await trio.sleep(1.0)
    named, summaries = named_and_summarised(alert_texts(telegram_stub))
    assert len(named) == len(set(named)), named  # no alert twice
    assert set(named) <= set(worked) | set(orphans)
    assert len(named) + sum(summaries) == 14  # and none lost


async def test_a_burst_during_a_telegram_outage_arrives_after_it_throttled(dsn: str, db: Any,
                                                                          telegram_stub: TelegramStub) -> None:
    telegram_stub.plan("sendMessage", [Reply(502)] * 3, chat_id=ALERT_CHAT)
    ids = await JobStore(db).enqueue_many([NewJob("no.such.kind") for _ in range(20)])
    async with running_service(service_settings(dsn, telegram_stub.url)):
        assert await wait_until(lambda: all_sent(db, 20), timeout=30)
        await trio.sleep(0.5)
    texts = alert_texts(telegram_stub)[3:]  # after the three 502s
    _named, summaries = named_and_summarised(texts)
    assert len(summaries) == 1 and len(texts) <= 3, texts
    assert sorted(every_named(texts)) == sorted(ids)


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


async def test_delivered_while_the_database_is_down_is_marked_later_not_sent_again(
    pg: RestartablePg, telegram_stub: TelegramStub, caplog: pytest.LogCaptureFixture
) -> None:
    # Telegram accepts the alert while PostgreSQL is away: the mark waits for the
    # database (a resend would be the at-least-once repeat; it must not be needed here)
    telegram_stub.plan("sendMessage", [Reply(delay=4)], chat_id=ALERT_CHAT)
    settings = service_settings(pg.dsn, telegram_stub.url, http_timeout_seconds=10)
    async with running_service(settings) as svc:
        job_id = await svc.deps.store.enqueue(NewJob("no.such.kind"))
        svc.deps.doorbell.set()
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)
        await trio.to_thread.run_sync(pg.stop)  # within the 4 s Telegram takes to answer
        await trio.sleep(5)
        await trio.to_thread.run_sync(pg.start)

        def marked() -> Any:
            with pg.connect() as conn:
                return conn.execute("select sent_as from alerts where sent_at is not null").fetchone()

        assert await wait_until(lambda: trio.to_thread.run_sync(marked), timeout=20) == ("single",)
    assert "could not mark 1 alert(s) sent" in caplog.text  # the case this test is about happened
    calls = telegram_stub.calls_of("sendMessage", chat_id=ALERT_CHAT)
    assert len(calls) == 1 and str(calls[0].params["text"]).startswith(f"autom: job {job_id} (no.such.kind)")


async def test_two_senders_and_a_slow_telegram_name_every_failed_job_in_exactly_one_message(
    dsn: str, db: Any, telegram_stub: TelegramStub,
) -> None:
    """Sender A claims six alerts and sends them one by one to a Telegram that takes a
    second each, longer in all than A's lease; sender B polls meanwhile. A claim of B
    must not take over rows A still sends, and A must not mark or resend rows B took:
    each claim carries its own token (issue 11)."""
    from autom.alerts import AlertSender, AlertThrottle
    from autom.db import open_database
    from autom.deps import Deps
    from autom.telegram import open_telegram

    telegram_stub.plan("sendMessage", [Reply(delay=1.0)] * 12, chat_id=ALERT_CHAT)
    later = datetime.now(UTC) + timedelta(hours=1)  # recorded as failed directly: nobody runs them
    ids = await JobStore(db).enqueue_many([NewJob("slow.kind", run_at=later) for _ in range(6)])
    await db.execute("update jobs set status = 'failed', last_error = 'boom' where id = any(%s)", [ids])
    settings = service_settings(dsn, telegram_stub.url, http_timeout_seconds=2.0)

    async with open_database(dsn, min_size=1, max_size=4) as own_db, \
            open_telegram(settings) as tg_a, open_telegram(settings) as tg_b:
        def sender(telegram: Any) -> AlertSender:
            deps = Deps(settings=settings, db=own_db, store=JobStore(own_db), sources={}, telegram=telegram)
            one = AlertSender(deps, throttle=AlertThrottle(limit=20))
            one.lease = 2.5  # shorter than six sends of a second each
            return one

        a, b = sender(tg_a), sender(tg_b)
        for job_id in ids:
            a.bell.ring(job_id)  # A's workers failed them: A takes them at once
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.send_round)
            with trio.fail_after(5):  # A has them
                while await db.fetch_val("select count(*) from alerts where claimed_until is not null") < 6:
                    await trio.sleep(0.05)
            await nursery.start(b.run)
            assert await wait_until(lambda: all_sent(db, 6), timeout=40)
            await trio.sleep(2.5)  # a late duplicate would show up within one more poll of B
            nursery.cancel_scope.cancel()
    named, summaries = named_and_summarised(alert_texts(telegram_stub))
    assert summaries == []
    assert sorted(named) == sorted(ids), named  # each failed job in exactly one message
