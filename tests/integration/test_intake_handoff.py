"""The intake's hand-off (``StoreBatcher`` with a ``HandOff``, autom/events/; migrations/0012).

When the worker pool of the intake's process is idle, a lone delivery's job is stored
already claimed by that process, in the delivery's own transaction, and given to the
pool: no claim statement runs for it. These tests read what happened from SQL state:
a handed-off job was claimed in the event's own transaction (lease generation 1,
``autom_lease_generation``, migrations/0014) (its ``claimed_at`` is the
event's ``received_at``, the transaction's ``now()``, and its row the event's
``xmin``), and no NOTIFY went out for it. They check every guarantee of the claim and
each fallback to the ordinary store (the job pending, the workers claim it).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

from autom.db import open_database
from autom.events import FATE_SECONDS, StoreBatcher, store_params
from autom.jobs.models import Job, NewJob
from autom.jobs.outcome import Outcome
from autom.jobs.store import JobStore
from tests.integration.test_worker_pool import make_pool
from tests.support.queue import claim_one, complete, settle_many
from tests.support.service import wait_until

HEADERS = {"content-type": "application/json"}


def delivery(n: int, *jobs: NewJob) -> dict[str, Any]:
    """``store_params`` of delivery ``n`` (dedup key ``k<n>``) making ``jobs``."""
    return store_params("site", HEADERS, json.dumps({"n": n}), f"k{n}", list(jobs))


class Taker:
    """A ``HandOff`` that records what it is given (``accept`` False: a pool that stopped)."""

    def __init__(self, store: JobStore, *, ready: bool = True, accept: bool = True) -> None:
        self.lease_seconds = store.lease_seconds
        self.store = store
        self.is_ready = ready
        self.accept = accept
        self.taken: list[tuple[Job, float]] = []
        self.given_back: list[Job] = []

    def ready(self) -> bool:
        return self.is_ready

    def take(self, job: Job, sent_at: float) -> bool:
        if self.accept:
            self.taken.append((job, sent_at))
        return self.accept

    async def give_back(self, job: Job) -> None:
        self.given_back.append(job)
        await settle_many(self.store, [Outcome.released(job)])


async def job_state(db: Any, job_id: int) -> dict[str, Any]:
    """The job's row, and whether it was claimed in its event's own transaction."""
    row = await db.fetch_one(
        "select j.status, j.attempts, autom_lease_generation(j.lease) as lease, j.recipient, j.locked_until,"
        " j.claimed_at is not null and j.claimed_at = e.received_at as claimed_with_event,"
        " j.xmin::text = e.xmin::text as same_row_version, j.claimed_by"
        " from jobs j join events e on e.id = j.event_id where j.id = %(id)s", {"id": job_id})
    assert row is not None
    return row


async def only_job_of(db: Any, event_id: int) -> int:
    return int(await db.fetch_val("select id from jobs where event_id = %(e)s", {"e": event_id}))


@asynccontextmanager
async def notifications(dsn: str) -> AsyncIterator[Any]:
    """A connection LISTENing on autom_jobs: ``until_marker()`` sends a NOTIFY ``marker`` and
    returns the payloads received up to it (notifications arrive in commit order)."""
    sync = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn, autocommit=True))
    try:
        await trio.to_thread.run_sync(sync.execute, "listen autom_jobs")

        def drain_until_marker() -> list[str]:
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("select pg_notify('autom_jobs', 'marker')")
            seen: list[str] = []
            for note in sync.notifies(timeout=10):
                seen.append(note.payload)
                if note.payload == "marker":
                    break
            return seen

        class Notes:
            async def until_marker(self) -> list[str]:
                return await trio.to_thread.run_sync(drain_until_marker)

        yield Notes()
    finally:
        await trio.to_thread.run_sync(sync.close)


async def test_an_idle_pools_job_is_stored_claimed_and_runs_without_a_claim(db: Any, dsn: str) -> None:
    """The real pool takes the job it is handed: claimed in the event's transaction (attempt 1,
    lease generation 1, its recipient busy with it), no NOTIFY, no claim statement; it runs, completes
    through the pool's writer, and frees its recipient for the next job."""
    started = trio.Event()
    finish = trio.Event()
    ran: list[Job] = []

    async def handler(ctx: Any, job: Job) -> None:
        ran.append(job)
        started.set()
        await finish.wait()

    pool, store = make_pool(db, {"chat.reply": handler}, workers=2)
    batcher = StoreBatcher(db, handoff=pool)
    async with trio.open_nursery() as nursery, notifications(dsn) as notes:
        await nursery.start(pool.run)
        await wait_until(lambda: store.claims)  # its first claim found nothing: it sleeps (poll 10 s)
        assert pool.ready()
        claims_before = len(store.claims)
        stored = await batcher.deliver(delivery(1, NewJob("chat.reply", {"t": "hi"}, recipient="c1")))
        assert stored.event_id is not None and stored.jobs == 1 and stored.handed == 1
        job_id = await only_job_of(db, stored.event_id)
        state = await job_state(db, job_id)
        assert state["status"] == "running" and state["attempts"] == 1 and state["lease"] == 1
        assert state["claimed_with_event"] and state["same_row_version"]
        # no claimant, though the pool has one (its first claim): tests/e2e/test_roles.py tells a
        # hand-off from a worker pool's claim by it
        assert state["claimed_by"] is None and await db.fetch_val("select count(*) from worker_starts") == 1
        recipient = await db.fetch_one("select busy_job, busy_until from recipients where recipient = 'c1'")
        assert recipient == {"busy_job": job_id, "busy_until": state["locked_until"]}
        assert await notes.until_marker() == ["marker"]  # no NOTIFY for a job nobody else may claim
        await started.wait()
        assert [(j.id, j.generation, j.attempts, j.recipient) for j in ran] == [(job_id, 1, 1, "c1")]
        assert len(store.claims) == claims_before  # the fetcher was not woken for it
        assert not pool.ready() or pool.workers > 1
        # while it runs, a claim cannot take its recipient's next job
        await store.enqueue(NewJob("chat.reply", recipient="c1"))
        assert await claim_one(JobStore(db)) is None
        finish.set()

        async def done() -> bool:
            return (await job_state(db, job_id))["status"] == "done"

        await wait_until(done)
        # its recipient is free again: the pool claims the next job itself
        await wait_until(lambda: len(ran) == 2)
        pool.deps.shutdown.value = True
    assert ran[1].recipient == "c1" and ran[1].generation == 1 and ran[1].id != job_id


async def test_the_job_is_stored_pending_when_the_pool_is_busy(db: Any, dsn: str) -> None:
    store = JobStore(db)
    taker = Taker(store, ready=False)
    batcher = StoreBatcher(db, handoff=taker)
    async with notifications(dsn) as notes:
        stored = await batcher.deliver(delivery(1, NewJob("k", recipient="c1")))
        assert stored.handed == 0 and stored.jobs == 1 and taker.taken == []
        assert await notes.until_marker() == ["", "marker"]  # the ordinary enqueue rang the workers
    state = await job_state(db, await only_job_of(db, stored.event_id or 0))
    assert state["status"] == "pending" and state["attempts"] == 0 and state["lease"] == 0


@pytest.mark.parametrize("case", [
    "recipient_running", "recipient_line_not_empty", "other_job_due", "expired_lease_due",
    "paused_kind", "paused_backlog", "run_at_later", "two_jobs", "key_taken",
])
async def test_a_job_the_claim_would_not_take_now_falls_back_to_the_ordinary_store(
    db: Any, case: str
) -> None:
    """Each rule of the claim the hand-off keeps: the job is stored pending and the workers'
    claim takes it in its turn (one running job per recipient, FIFO per recipient, no
    queue-jumping over anything due, paused kinds, run_at, keys)."""
    from datetime import UTC, datetime, timedelta

    store = JobStore(db)
    taker = Taker(store)
    batcher = StoreBatcher(db, handoff=taker)
    jobs = [NewJob("k", {"n": 1}, recipient="c1")]
    if case == "recipient_running":
        await store.enqueue(NewJob("k", recipient="c1"))
        assert await claim_one(store) is not None
    elif case == "recipient_line_not_empty":
        # a retry-waiting head holds the line: the new job must wait behind it
        await store.enqueue(NewJob("k", recipient="c1"))
        head = await claim_one(store)
        assert head is not None
        await settle_many(store, [Outcome.retry(head, "boom", 3600.0)])
    elif case == "other_job_due":
        await store.enqueue(NewJob("k"))  # recipient-less, due, unclaimed: it goes first
    elif case == "expired_lease_due":
        await store.enqueue(NewJob("k", recipient="c2"))
        lost = await claim_one(store)
        assert lost is not None
        await db.execute("update jobs set locked_until = now() - interval '1 s' where id = %(id)s", {"id": lost.id})
    elif case == "paused_kind":
        await db.execute("insert into paused_kinds (kind) values ('k')")
    elif case == "paused_backlog":
        await db.execute("insert into paused_kinds (kind) values ('slow')")
        await store.enqueue(NewJob("slow"))  # due but paused: left to the claim's order all the same
    elif case == "run_at_later":
        jobs = [NewJob("k", recipient="c1", run_at=datetime.now(UTC) + timedelta(hours=1))]
    elif case == "two_jobs":
        jobs = [NewJob("k", recipient="c1"), NewJob("k", recipient="c1")]
    elif case == "key_taken":
        await store.enqueue(NewJob("k", key="once"))
        await db.execute("update jobs set status = 'done', finished_at = now() where key = 'once'")
        jobs = [NewJob("k", key="once", recipient="c1")]
    stored = await batcher.deliver(delivery(1, *jobs))
    assert stored.event_id is not None and stored.handed == 0 and taker.taken == []
    assert stored.jobs == (0 if case == "key_taken" else len(jobs))
    rows = await db.fetch_all("select status, attempts, autom_lease_generation(lease) as lease from jobs"
                              " where event_id = %(e)s", {"e": stored.event_id})
    assert [(r["status"], r["attempts"], r["lease"]) for r in rows] == [("pending", 0, 0)] * stored.jobs
    if case == "recipient_line_not_empty":
        # the waiting head still comes first: the new job is not claimable before it
        assert await claim_one(store) is None


async def test_a_handed_off_job_takes_its_own_max_attempts_else_its_kinds_else_8(db: Any) -> None:
    """The hand-off reads the kind's max_attempts only for a job that names none (migrations/0036:
    a statement of its own, so the job's insert keeps one plan); each job is handed off."""
    await db.execute("insert into kinds (kind, max_attempts) values ('registered', 3)")
    store = JobStore(db)
    taker = Taker(store)
    batcher = StoreBatcher(db, handoff=taker)
    cases = [(NewJob("registered", recipient="a"), 3), (NewJob("registered", recipient="b", max_attempts=5), 5),
             (NewJob("unknown", recipient="c"), 8)]
    for n, (job, _) in enumerate(cases, 1):
        stored = await batcher.deliver(delivery(n, job))
        assert stored.handed == 1
        assert await complete(store, taker.taken[-1][0])
    assert [job.max_attempts for job, _ in taker.taken] == [want for _, want in cases]
    rows = await db.fetch_all("select max_attempts from jobs order by id")
    assert [r["max_attempts"] for r in rows] == [want for _, want in cases]


async def test_a_handed_off_telegram_update_clears_its_chats_blocked_mark(db: Any) -> None:
    """jobs_telegram_chat_seen (migrations/0020, 0024) fires for a job stored claimed too."""
    await db.execute("insert into telegram_blocked (chat_id, reason) values ('77', 'test'), ('78', 'test')")
    store = JobStore(db)
    taker = Taker(store)
    batcher = StoreBatcher(db, handoff=taker)
    params = store_params("telegram", HEADERS, json.dumps({"update_id": 1}), "1",
                          [NewJob("telegram.message", {"chat_id": 77, "text": "hi"}, recipient="77")])
    stored = await batcher.deliver(params)
    assert stored.handed == 1
    rows = await db.fetch_all("select chat_id from telegram_blocked order by chat_id")
    assert [r["chat_id"] for r in rows] == ["78"]


async def test_a_redelivery_is_a_duplicate_and_hands_off_nothing(db: Any) -> None:
    store = JobStore(db)
    taker = Taker(store)
    batcher = StoreBatcher(db, handoff=taker)
    first = await batcher.deliver(delivery(1, NewJob("k", recipient="c1")))
    assert first.handed == 1
    again = await batcher.deliver(delivery(1, NewJob("k", recipient="c1")))
    assert again == (None, 0, 0) and len(taker.taken) == 1
    assert await db.fetch_val("select count(*) from jobs") == 1


async def test_a_claim_holding_the_recipient_is_waited_for_and_then_seen(db: Any, dsn: str) -> None:
    """A claim of the recipient's earlier job that commits while the hand-off waits for the
    recipient's row: the hand-off's check runs after the lock, so it sees the claim (busy)
    and falls back; one running job for the recipient, the new one behind it."""
    from autom.db.queries import Q

    store = JobStore(db)
    taker = Taker(store)
    earlier = await store.enqueue(NewJob("k", recipient="c1"))
    claimer = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn))
    try:
        rows = await trio.to_thread.run_sync(
            lambda: claimer.execute(Q.claim, {"n": 1, "lease_seconds": 60.0, "durable": True, "claimant": None,
                                              "ticket": 0, "now_n": 1}).fetchall())
        assert [r[0] for r in rows] == [earlier]  # claimed, not committed: the row is locked
        result: list[Any] = []
        async with trio.open_nursery() as nursery:
            async def hand() -> None:
                result.append(await StoreBatcher(db, handoff=taker).deliver(
                    delivery(1, NewJob("k", recipient="c1"))))

            nursery.start_soon(hand)

            async def waits_for_lock() -> bool:
                return bool(await db.fetch_val(
                    "select count(*) from pg_stat_activity where datname = current_database()"
                    " and wait_event_type = 'Lock' and query like '%%autom_intake_store_handoff%%'"))

            await wait_until(waits_for_lock)
            await trio.to_thread.run_sync(claimer.commit)
    finally:
        await trio.to_thread.run_sync(claimer.close)
    [stored] = result
    assert stored.handed == 0 and taker.taken == []
    running = await db.fetch_val("select count(*) from jobs where recipient = 'c1' and status = 'running'")
    assert running == 1
    assert (await job_state(db, await only_job_of(db, stored.event_id or 0)))["status"] == "pending"


async def test_a_job_the_stopping_pool_does_not_take_goes_back_to_pending(db: Any) -> None:
    """The pool stopped between the check and the statement's answer: the job is given back
    at once (pending, its attempt not counted, its recipient free) and claimed as usual."""
    store = JobStore(db)
    taker = Taker(store, accept=False)
    stored = await StoreBatcher(db, handoff=taker).deliver(delivery(1, NewJob("k", recipient="c1")))
    assert stored.jobs == 1 and stored.handed == 0 and len(taker.given_back) == 1
    job_id = await only_job_of(db, stored.event_id or 0)
    state = await job_state(db, job_id)
    assert (state["status"], state["attempts"], state["lease"]) == ("pending", 0, 1)
    again = await claim_one(store)
    assert again is not None and (again.id, again.attempts, again.generation) == (job_id, 1, 2)
    assert await complete(store, again)


async def test_the_real_pool_once_stopped_takes_nothing_and_gives_the_job_back(db: Any) -> None:
    """WorkerPool's side of it: once its fetcher has stopped it is not ready and takes no job,
    and its give_back puts the job back to pending (as the check passed just before the stop)."""
    pool, store = make_pool(db, {"k": lambda ctx, job: None}, workers=1)
    assert not pool.ready()  # not started
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        assert pool.ready()
        pool.deps.shutdown.value = True
        assert not pool.ready()
    taker = Taker(store)
    taker.take = pool.take  # type: ignore[method-assign]
    taker.give_back = pool.give_back  # type: ignore[method-assign]
    stored = await StoreBatcher(db, handoff=taker).deliver(delivery(1, NewJob("k", recipient="c1")))
    assert stored.jobs == 1 and stored.handed == 0
    state = await job_state(db, await only_job_of(db, stored.event_id or 0))
    assert (state["status"], state["attempts"], state["lease"]) == ("pending", 0, 1)
    assert await db.fetch_val("select busy_until from recipients where recipient = 'c1'") is None


async def test_a_hop_whose_connection_drops_after_commit_still_hands_its_job_off(dsn: str) -> None:
    """The statement committed and the connection dropped before its answer: the commit record
    says which job was handed off, and the pool gets it (claimed by this process, generation 1)."""
    from tests.support.pg_proxy import pg_proxy

    async with pg_proxy(dsn) as proxy, open_database(proxy.dsn, min_size=2, max_size=4, pool_timeout=1.0) as db:
        store = JobStore(db)
        taker = Taker(store)
        proxy.cut_after_commit(b"autom_intake_store_handoff")
        sent = trio.current_time()
        stored = await StoreBatcher(db, handoff=taker).deliver(delivery(1, NewJob("k", recipient="c1")))
        assert proxy.cuts == 1
        assert stored.event_id is not None and stored.jobs == 1 and stored.handed == 1
        [(job, sent_at)] = taker.taken
        assert (job.generation, job.attempts, job.recipient) == (1, 1, "c1") and sent_at >= sent
        assert (await job_state(db, job.id))["claimed_with_event"]
        assert await complete(store, job)


async def test_a_hop_cancelled_at_its_deadline_after_commit_still_hands_its_job_off(dsn: str) -> None:
    """The statement committed but its answer comes after the delivery's deadline (a proxy
    holds it back): the cancelled hop's commit record names the handed-off job, and the
    pool gets it all the same."""
    from tests.support.pg_proxy import pg_proxy

    async with pg_proxy(dsn) as proxy, open_database(proxy.dsn, min_size=2, max_size=4, pool_timeout=1.0) as db:
        store = JobStore(db)
        taker = Taker(store)
        proxy.hold_after_commit(b"autom_intake_store_handoff", 1.5)  # the hop is cut off 1 s in
        stored = await StoreBatcher(db, handoff=taker).deliver(
            delivery(1, NewJob("k", recipient="c1")), trio.current_time() + FATE_SECONDS + 1.0)
        assert proxy.holds == 1
        assert stored.event_id is not None and stored.jobs == 1 and stored.handed == 1
        [(job, _sent)] = taker.taken
        assert (job.generation, job.attempts, job.recipient) == (1, 1, "c1")
        assert (await job_state(db, job.id))["claimed_with_event"]
        assert await complete(store, job)


def _handoff_after_a_drain(dsn: str, statistics: str) -> tuple[Any, list[dict[str, Any]]]:
    """A drained table (20,000 jobs done, not vacuumed) and one job due in an hour: the plan of the
    hand-off's "is any job due?" as the deployed function has it (EXPLAIN of its expression, read
    from pg_proc: PL/pgSQL runs "ok := expr" as "select expr"), and a hand-off's row."""
    from autom.db.queries import Q

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("insert into jobs (kind) select 'old' from generate_series(1, 20000)")
        if statistics == "of_the_backlog":
            conn.execute("analyze jobs")
        conn.execute("update jobs set status = 'done', finished_at = now()")
        conn.execute("insert into jobs (kind, run_at) values ('later', now() + interval '1 hour')")
        (source,) = conn.execute("select prosrc from pg_proc where proname = 'autom_intake_store_handoff'").fetchone()
        (check,) = re.findall(r"ok := ([^;]*\bjobs d\b[^;]*);", source)
        (plan,) = conn.execute("explain (format json) select " + check).fetchone()[0]
        row = conn.execute(Q.intake_store_handoff, {**delivery(1, NewJob("k", recipient="c1")),
                                                    "lease_seconds": 30.0}).fetchone()
    return row, plan


@pytest.mark.parametrize("statistics", ["none", "of_the_backlog"])
async def test_after_a_drain_the_hand_off_finds_the_earliest_due_job_by_index(dsn: str, statistics: str) -> None:
    """After a 20,000-job drain, with no statistics of jobs or with the backlog's (every row
    due), "is any job due?" reads jobs_due_all, not the table: a sequential scan planned for
    many due rows read all 20,000 finished ones in every hand-off (bench/RESULTS.md, Speed
    round five). A job due later does not stop the hand-off."""
    from tests.integration.test_queue import _scans

    row, plan = await trio.to_thread.run_sync(_handoff_after_a_drain, dsn, statistics)
    reads = [scan for scan in _scans(plan["Plan"]) if scan[1] == "jobs"]
    assert reads and all(index == "jobs_due_all" for _, _, index in reads), reads
    assert row is not None and row[2] is not None  # handed off: nothing due now
