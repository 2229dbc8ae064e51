"""WorkerPool on a real PostgreSQL without the rest of the service: claims ahead of
the handlers (prefetch) within a cap, handlers gated to WORKERS, claimed jobs not
started given back at shutdown, claims only when work can be waiting, and fairness
counted in claim statements (not time)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from autom.config import Settings
from autom.deps import Deps
from autom.jobs.models import Job, NewJob
from autom.jobs.store import Ahead, JobStore
from autom.worker import WorkerPool
from tests.support.queue import claim_one
from tests.support.service import wait_until


class CountingStore(JobStore):
    """A JobStore that notes every claim statement and what it returned."""

    def __init__(self, db: Any, **kwargs: Any) -> None:
        super().__init__(db, **kwargs)
        self.claims: list[tuple[int, list[Job]]] = []  # (n asked, jobs returned)
        self.pool: WorkerPool | None = None
        self.most_held = 0  # the most jobs the pool held right after a claim
        self.most_over = -1  # the most it held beyond its capacity of the moment (never > 0)

    async def claim(self, n: int = 1, *, durable: bool = True, ahead: Ahead | None = None) -> list[Job]:
        jobs = await super().claim(n, durable=durable, ahead=ahead)
        self.claims.append((n, jobs))
        if self.pool is not None:
            held = self.pool.in_flight + len(jobs)
            self.most_held = max(self.most_held, held)
            self.most_over = max(self.most_over, held - self.pool.capacity)
        return jobs


class NoTelegram:
    async def alert_job_failed(self, *args: Any) -> bool:
        return True


def make_pool(db: Any, handlers: dict[str, Any], *, workers: int, lease: float = 30.0,
              poll: float = 10.0, **kwargs: Any) -> tuple[WorkerPool, CountingStore]:
    store = CountingStore(db, lease_seconds=lease)
    deps = Deps(settings=Settings(workers=workers), db=db, store=store, sources={},
                telegram=NoTelegram())  # type: ignore[arg-type]
    pool = WorkerPool(deps, handlers, workers=workers, poll_seconds=poll, **kwargs)
    store.pool = pool
    return pool, store


def claim_number(store: CountingStore, job_id: int) -> int:
    """1-based number of the claim statement that returned ``job_id``."""
    return next(i for i, (_, jobs) in enumerate(store.claims, 1) if any(j.id == job_id for j in jobs))


def test_prefetch_is_capped_at_one_batch() -> None:
    deps = Deps(settings=Settings(workers=16), db=None, store=JobStore(None), sources={},  # type: ignore[arg-type]
                telegram=NoTelegram())  # type: ignore[arg-type]
    assert WorkerPool(deps, {}, workers=16, batch=50).prefetch == 34  # fills one batch
    assert WorkerPool(deps, {}, workers=4, batch=50).prefetch == 46
    assert WorkerPool(deps, {}, workers=16, batch=10).prefetch == 10  # never more than a batch
    assert WorkerPool(deps, {}, workers=16, batch=50, prefetch=500).prefetch == 50
    assert WorkerPool(deps, {}, workers=16, prefetch=0).capacity == 16
    # until a kind's pace is known, one waits (a slow kind is not held away from other replicas)
    assert WorkerPool(deps, {}, workers=16, batch=100).capacity == 17
    assert WorkerPool(deps, {}, workers=2, batch=10, prefetch=1).capacity == 3
    # the default batch: 10 a worker, at least 100, at most 200 (what a kill leaves leased)
    assert [WorkerPool(deps, {}, workers=w).fetcher.batch for w in (1, 8, 16, 20, 64)] == [100, 100, 160, 200, 200]
    assert [WorkerPool(deps, {}, workers=w).prefetch for w in (1, 8, 16, 64)] == [99, 92, 144, 136]


@pytest.mark.parametrize("backlog_recipient", [None, "big"])
async def test_a_lone_recipient_is_claimed_within_a_few_claims_behind_any_backlog(db, backlog_recipient):
    """10,000 jobs (without a recipient, or all for one recipient), then one job for
    'small': the pool's claims must reach it within the first few statements."""
    store = JobStore(db)
    await store.enqueue_many([NewJob("noop", recipient=backlog_recipient) for _ in range(10_000)])
    small = await store.enqueue(NewJob("noop", recipient="small"))
    started: list[int] = []

    async def noop(ctx: Any, job: Job) -> None:
        started.append(job.id)
        if job.id == small:
            pool.deps.shutdown.value = True

    pool, counting = make_pool(db, {"noop": noop}, workers=16)
    with trio.fail_after(30):
        await pool.run()
    assert small in started
    assert claim_number(counting, small) <= 2
    # and its handler did not wait for the backlog: at most the claims before it had run
    assert started.index(small) <= sum(len(jobs) for _, jobs in counting.claims[:2])


async def test_single_job_claims_alternate_lanes(db):
    """Even claims of one job (n=1) cannot starve a recipient behind a recipient-less
    backlog: the lanes take turns, the lane that goes first is a coin toss."""
    store = JobStore(db)
    await store.enqueue_many([NewJob("noop") for _ in range(200)])
    small = await store.enqueue(NewJob("noop", recipient="small"))
    for _ in range(40):
        job = await claim_one(store)
        assert job is not None
        if job.id == small:
            break
    assert job.id == small, "40 single-job claims never reached the recipient"  # chance 2^-40


async def test_handlers_never_exceed_workers_and_the_claims_stay_within_capacity(db):
    store = JobStore(db)
    await store.enqueue_many([NewJob("slow") for _ in range(60)])
    running = 0
    most = 0
    done = 0

    async def slow(ctx: Any, job: Job) -> None:
        nonlocal running, most, done
        running += 1
        most = max(most, running)
        await trio.sleep(0.08)
        running -= 1
        done += 1
        if done == 60:
            pool.deps.shutdown.value = True

    pool, counting = make_pool(db, {"slow": slow}, workers=4, batch=10)
    assert (pool.prefetch, pool.capacity) == (6, 5)  # one waits until the kind's pace is known
    with trio.fail_after(30):
        await pool.run()
    assert done == 60
    assert most == 4
    assert counting.most_over <= 0
    assert counting.most_held <= 4 + pool.prefetch
    # the claims ran ahead of the handlers: more jobs were held than were running
    assert counting.most_held > 4
    assert all(n <= 10 for n, _ in counting.claims)
    assert await db.fetch_val("select count(*) from jobs where status = 'done'") == 60
    # 80 ms handlers: what waits shrank to what the workers start during two claims' round trips
    # (4 / 0.08 s × 2 claims: below the prefetch of 6 while a claim takes under 60 ms; with 20 ms
    # handlers a claim of 15 ms, seen on a loaded machine, reached it)
    assert pool.capacity < 4 + pool.prefetch


async def test_claimed_jobs_not_started_go_back_at_shutdown_without_counting_an_attempt(db):
    store = JobStore(db)
    ids = await store.enqueue_many([NewJob("hang") for _ in range(10)])
    entered: list[int] = []

    async def hang(ctx: Any, job: Job) -> None:
        entered.append(job.id)
        await trio.sleep_forever()

    pool, _ = make_pool(db, {"hang": hang}, workers=4, batch=4, prefetch=4)
    pool.fetcher.kind_seconds["hang"] = 0.001  # known fast: a whole prefetch waits
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await wait_until(lambda: _value(len(pool.running) == 4 and len(pool.queued) == 4))
        assert await db.fetch_val("select count(*) from jobs where status = 'running'") == 8
        pool.deps.shutdown.value = True
        # the 4 queued jobs are given back at once; the 4 running ones keep running
        await wait_until(lambda: db.fetch_val("select count(*) = 6 from jobs where status = 'pending'"))
        assert len(entered) == 4 and len(pool.running) == 4
        rows = await db.fetch_all("select id, status, attempts from jobs where status = 'pending'")
        assert all(r["attempts"] == 0 for r in rows)
        # the hard deadline puts the running ones back too
        pool.stop_at(trio.current_time() + 0.2)
    rows = await db.fetch_all("select id, status, attempts from jobs order by id")
    assert [(r["status"], r["attempts"]) for r in rows] == [("pending", 0)] * 10
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert len(entered) == 4  # no queued job started after shutdown


async def test_no_claim_after_a_completion_that_freed_nothing_but_a_recipients_next_job_is_claimed(db):
    store = JobStore(db)
    seen: list[str] = []

    async def note(ctx: Any, job: Job) -> None:
        seen.append(job.payload["name"])

    pool, counting = make_pool(db, {"note": note}, workers=4, poll=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await wait_until(lambda: _value(len(counting.claims) >= 1))
        # a job without a recipient: one claim finds it, and its completion rings nobody
        await store.enqueue(NewJob("note", {"name": "free"}))
        pool.deps.doorbell.set()
        await wait_until(lambda: _value(pool.completer.flushes == 1))
        await trio.sleep(0.3)
        assert len(counting.claims) == 2
        # two jobs of one recipient: the second is claimed when the first's completion frees it
        await store.enqueue_many([NewJob("note", {"name": f"r{i}"}, recipient="chat") for i in range(2)])
        pool.deps.doorbell.set()
        with trio.fail_after(5):  # far below the 30 s poll
            await wait_until(lambda: _value(seen[-1:] == ["r1"]))
        pool.deps.shutdown.value = True
    assert seen == ["free", "r0", "r1"]


async def _value(value: Any) -> Any:
    return value


async def test_a_run_can_commit_done_in_the_handlers_own_transaction(db):
    """The seam for handler contexts: ``run.complete_in(tx)`` commits the handler's writes
    and "done" together; a claim that is gone raises LeaseLost and nothing commits."""
    from autom.errors import LeaseLost

    store = JobStore(db)
    kept, lost = await store.enqueue_many([NewJob("write", {"name": "kept"}), NewJob("write", {"name": "lost"})])
    raised: list[str] = []

    async def write(run: Any, job: Job) -> None:
        try:
            async with db.transaction() as tx:
                await tx.execute("insert into service_state (name) values (%s)", [job.payload["name"]])
                if job.id == lost:
                    # another claim took the job meanwhile (its lease generation moved on)
                    await db.execute("update jobs set lease = lease + 1 where id = %s", [job.id])
                await run.complete_in(tx)
        except LeaseLost as exc:
            raised.append(str(exc))
            raise

    pool, _ = make_pool(db, {"write": write}, workers=2, context=lambda run: run)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [kept]))
        await wait_until(lambda: _value(len(raised) == 1 and pool.completer.pending == 0 and not pool.running))
        pool.deps.shutdown.value = True
    assert [r["name"] for r in await db.fetch_all("select name from service_state")] == ["kept"]
    rows = {r["id"]: r for r in await db.fetch_all("select id, status, attempts from jobs")}
    # the lost run's outcome (fenced) matched nothing: the job is still the other claim's.
    # (How many flushes the writer took is not asserted: a renewal round or a slow machine
    # may split them, and it failed one run in many under load.)
    assert (rows[kept]["status"], rows[lost]["status"]) == ("done", "running")
    assert rows[lost]["attempts"] == 1
