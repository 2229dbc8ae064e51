"""Keys unique per kind, each kind's max_attempts for every producer, and an enqueue
that says per job what it created (migrations/0022; CONTRACT.md, Queue semantics)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import autom
from autom import App, HandlerContext, Job
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore, insert_jobs
from autom.testing import open_testbed
from autom.ticker import due_jobs


def rows(dsn: str) -> list[tuple[str, str | None, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("select kind, key, max_attempts from jobs order by id").fetchall()


def sql_enqueue(dsn: str, jobs: list[dict]) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("select autom_enqueue(%s::jsonb)", [json.dumps(jobs)])]


async def test_a_kinds_max_attempts_holds_for_jobs_enqueued_from_outside(db, dsn: str) -> None:
    """A kind registered with 3 gets 3 through SQL autom_enqueue, autom.enqueue and
    enqueue_sync; what the producer said wins; a kind nobody registered gets 8."""
    await JobStore(db).register_kinds({"crm.sync": 3, "other": 5})  # what the service does at start
    sql_enqueue(dsn, [{"kind": "crm.sync", "payload": {}}, {"kind": "crm.sync", "max_attempts": 6},
                      {"kind": "unknown.kind"}])
    await autom.enqueue(dsn, "crm.sync", {"via": "enqueue"})
    autom.enqueue_sync(dsn, "crm.sync", {"via": "enqueue_sync"})
    with psycopg.connect(dsn) as conn:
        conn.execute("""select * from autom_enqueue_each('[{"kind": "crm.sync"}]'::jsonb)""")
        conn.commit()
    assert [r[2] for r in rows(dsn)] == [3, 6, 8, 3, 3, 3]


async def test_the_replica_that_registers_last_sets_the_kinds_default(db, dsn: str) -> None:
    """Two replicas with different code during a rolling deploy: the last start wins."""
    store = JobStore(db)
    await store.register_kinds({"crm.sync": 3})
    await store.register_kinds({"crm.sync": 4, "new.kind": 2})  # the newer replica starts
    sql_enqueue(dsn, [{"kind": "crm.sync"}, {"kind": "new.kind"}])
    await store.register_kinds({"crm.sync": 3})  # the older one restarts: last writer wins
    sql_enqueue(dsn, [{"kind": "crm.sync"}, {"kind": "new.kind"}])
    assert [r[2] for r in rows(dsn)] == [4, 2, 3, 2]


async def test_the_same_key_under_two_kinds_makes_two_jobs(db, dsn: str) -> None:
    store = JobStore(db)
    first = await store.enqueue(NewJob("orders.digest", key="orders.digest:2026-12-03"))
    second = await store.enqueue(NewJob("mail.send", key="orders.digest:2026-12-03"))
    third = await autom.enqueue(dsn, "report", key="orders.digest:2026-12-03")
    [fourth] = sql_enqueue(dsn, [{"kind": "sms.send", "key": "orders.digest:2026-12-03"}])
    assert None not in (first, second, third, fourth)
    assert len({first, second, third, fourth}) == 4
    assert rows(dsn) == [(k, "orders.digest:2026-12-03", 8) for k in ("orders.digest", "mail.send", "report",
                                                                       "sms.send")]
    # and within each kind the key still holds: nothing more
    assert await store.enqueue(NewJob("mail.send", key="orders.digest:2026-12-03")) is None
    assert sql_enqueue(dsn, [{"kind": "report", "key": "orders.digest:2026-12-03"}]) == []
    assert len(rows(dsn)) == 4


async def test_an_existing_key_creates_nothing_returns_none_and_logs_one_line_naming_the_job(
    db, dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("shop.order", {"id": 42}, key="order:42"))
    caplog.set_level(logging.INFO, logger="autom.enqueue")
    assert await store.enqueue(NewJob("shop.order", {"id": 43}, key="order:42")) is None
    assert await autom.enqueue(dsn, "shop.order", {"id": 44}, key="order:42") is None
    with psycopg.connect(dsn) as conn:
        assert autom.enqueue_sync(conn, "shop.order", {"id": 45}, key="order:42") is None
    lines = [r for r in caplog.records if r.name == "autom.enqueue"]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (logging.INFO, f"job not enqueued: kind shop.order key 'order:42' exists as job {job_id}")] * 3
    assert all(r.__dict__["job_id"] == job_id for r in lines)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select id, payload from jobs").fetchall() == [(job_id, {"id": 42})]


async def test_insert_jobs_answers_per_job_in_the_order_given(db, dsn: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """``insert_jobs(tx, jobs)`` (what ctx.enqueue calls in the handler's transaction):
    one answer per job, aligned with ``jobs``: the new id or None."""
    store = JobStore(db)
    taken = await store.enqueue(NewJob("a", key="k1"))
    jobs = [NewJob("a"), NewJob("a", key="k1"), NewJob("b", key="k1"), NewJob("b", key="k1"), NewJob("a", key="k2"),
            NewJob("c", recipient="r1")]
    caplog.set_level(logging.INFO, logger="autom.enqueue")
    async with db.transaction() as tx:
        ids = await insert_jobs(tx, jobs)
    assert [i is None for i in ids] == [False, True, False, True, False, False]
    made = [i for i in ids if i is not None]
    assert made == sorted(made)  # ids ascend in the order given
    with psycopg.connect(dsn) as conn:
        got = dict(conn.execute("select id, kind || ':' || coalesce(key, '-') from jobs").fetchall())
    assert [got[i] if i is not None else None for i in ids] == ["a:-", None, "b:k1", None, "a:k2", "c:-"]
    # the skipped ones name the job that has their kind and key (the second "b" the first one)
    assert [r.getMessage() for r in caplog.records if r.name == "autom.enqueue"] == [
        f"job not enqueued: kind a key 'k1' exists as job {taken}",
        f"job not enqueued: kind b key 'k1' exists as job {ids[2]}",
    ]
    assert await store.enqueue_each([]) == []


async def test_the_ticker_slot_and_a_follow_up_keyed_with_the_slot_under_another_kind_both_exist(dsn: str) -> None:
    """A scheduled handler that enqueues ``orders.mail`` keyed ``orders.digest:{slot}``: the
    ticker's own job of the slot has that key (kind orders.digest), and the follow-up
    is created all the same (it was skipped while keys were global)."""
    app = App()

    @app.handler("orders.digest")
    async def digest(ctx: HandlerContext, job: Job) -> None:
        await ctx.enqueue("orders.mail", {"slot": job.payload["slot"]}, key=f"orders.digest:{job.payload['slot']}")

    @app.handler("orders.mail")
    async def mail(ctx: HandlerContext, job: Job) -> None:
        pass

    app.schedule("orders.digest", daily_at="09:00")
    async with open_testbed(app, database_url=dsn) as bed:
        now = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
        [slot_job] = [j for j in due_jobs(bed.registry.schedules, now, UTC) if j.kind == "orders.digest"]
        assert slot_job.key == "orders.digest:2026-12-03"
        [job_id] = await bed.deps.store.enqueue_many([slot_job])  # exactly what the ticker enqueues
        run = await bed.run(job_id)
    assert run.status == "done"
    follow_up = run.assert_enqueued("orders.mail", slot="2026-12-03")
    assert follow_up.key == slot_job.key
    assert rows(dsn) == [("orders.digest", "orders.digest:2026-12-03", 8),
                         ("orders.mail", "orders.digest:2026-12-03", 8)]


def test_the_migration_keeps_the_jobs_and_makes_keys_per_kind(empty_dsn: str) -> None:
    """A database with jobs from before 0022: they stay as they were (and still hold
    their keys in their kind); afterwards the same key under another kind is a new job,
    for the enqueue functions and for the intake's hand-off (which named the old index)."""
    from autom.db.migrate import apply_pending, available_migrations
    from autom.db.queries import Q
    from autom.events import store_params

    shipped = available_migrations()
    before = [m for m in shipped if m.version < 22]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            apply_pending(conn, before)
        conn.execute("""select autom_enqueue('[{"kind": "orders.digest", "key": "orders.digest:1"},
                                              {"kind": "crm.sync", "key": "lead:1", "max_attempts": 2}]'::jsonb)""")
        with conn.transaction():
            assert [m.version for m in apply_pending(conn, shipped)] == [m.version for m in shipped if m.version >= 22]
        indexes = {r[0]: r[1] for r in conn.execute(
            "select indexname, indexdef from pg_indexes where tablename = 'jobs' and indexdef like '%UNIQUE%(%key)%'")}
        assert list(indexes) == ["jobs_kind_key"] and "(kind, key) WHERE (key IS NOT NULL)" in indexes["jobs_kind_key"]
        assert conn.execute("select kind, key, max_attempts from jobs order by id").fetchall() == [
            ("orders.digest", "orders.digest:1", 8), ("crm.sync", "lead:1", 2)]
        # the old keys still hold within their kind ...
        assert conn.execute("""select * from autom_enqueue_each('[{"kind": "crm.sync", "key": "lead:1"}]'::jsonb)"""
                            ).fetchall() == [(1, None, 2)]
        # ... and another kind may use them, through the enqueue and through the hand-off
        [(made,)] = conn.execute(
            """select autom_enqueue('[{"kind": "orders.mail", "key": "orders.digest:1"}]'::jsonb)""").fetchall()
        params = store_params("site", {}, "{}", "d1", [NewJob("crm.call", key="lead:1")])
        cursor = conn.execute(Q.intake_store_handoff, {"until": None, **params, "lease_seconds": 60.0})
        handed = cursor.fetchone()
        assert cursor.description is not None and handed is not None
        assert dict(zip([c.name for c in cursor.description], handed, strict=True))["jobs_created"] == 1
        assert conn.execute("select kind, key from jobs where id > %s order by id", [made - 1]).fetchall() == [
            ("orders.mail", "orders.digest:1"), ("crm.call", "lead:1")]


async def test_retention_never_reopens_a_slot_that_lasts_longer_than_the_key_keep(db, dsn: str) -> None:
    """A slot current for 30 days (every_minutes=43200): its done job, past retention and
    KEY_KEEP_SECONDS, is kept while it is the kind's newest slot job, so the ticker's next
    tick enqueues nothing; the slot before it, and an ordinary keyed job as old, go."""
    from autom.db.queries import Q
    from autom.handlers.prune import KEY_KEEP_SECONDS
    from autom.schedule import Schedule

    store = JobStore(db)
    monthly = (Schedule("report.monthly", every_minutes=43200),)
    now = datetime.now(UTC)
    [current] = due_jobs(monthly, now, UTC)
    [previous] = due_jobs(monthly, now - timedelta(days=30), UTC)
    ids = [await store.enqueue(job) for job in (previous, current, NewJob("site.form", key="site:old"))]
    # (the prune reads only the rows' ages, not when their slots began)
    await db.execute("update jobs set status = 'done', created_at = now() - interval '20 days',"
                     " finished_at = now() - interval '20 days'")
    await db.execute(Q.prune_done_jobs, {"keep_seconds": 7 * 86400, "key_keep_seconds": KEY_KEEP_SECONDS,
                                         "batch": 100})
    assert [r[1] for r in rows(dsn)] == [current.key]
    assert await store.enqueue_many(due_jobs(monthly, now, UTC)) == []  # the slot ran: not again
    assert ids[1] is not None


async def test_ctx_enqueue_of_an_existing_key_returns_none_and_logs_the_job(
    dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Inside a handler (ctx.enqueue through insert_jobs): the id, then None and one
    info line naming the job that has the kind and key; another kind gets its own job."""
    app = App()
    answers: list[int | None] = []

    @app.handler("orders.digest")
    async def digest(ctx: HandlerContext, job: Job) -> None:
        answers.append(await ctx.enqueue("orders.mail", {}, key="digest:1"))
        answers.append(await ctx.enqueue("orders.mail", {}, key="digest:1"))
        answers.append(await ctx.enqueue("orders.sms", {}, key="digest:1"))

    @app.handler("orders.mail")
    async def mail(ctx: HandlerContext, job: Job) -> None:
        pass

    @app.handler("orders.sms")
    async def sms(ctx: HandlerContext, job: Job) -> None:
        pass

    caplog.set_level(logging.INFO, logger="autom.enqueue")
    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("orders.digest")
    assert run.status == "done"
    first, again, other = answers
    assert first is not None and again is None and other is not None and other != first
    assert [r.getMessage() for r in caplog.records if r.name == "autom.enqueue"] == [
        f"job not enqueued: kind orders.mail key 'digest:1' exists as job {first}"]
    assert [(j.kind, j.key) for j in run.enqueued] == [("orders.mail", "digest:1"), ("orders.sms", "digest:1")]
