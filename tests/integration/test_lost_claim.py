"""A claim lost in a server crash: the next claim of the job never hands out its lease again.

A claim committed asynchronously (autom/jobs/store.py) can be lost in a crash of the
server after the worker had its answer. A crash is made here the way it looks
afterwards: the job's row (and its recipient's) are written back to what they were
before the claim, in SQL, as recovery would leave them. Then another claim takes the
job, with the same generation, and every fenced write of the lost claim's holder must
fail: complete, settle (retry, fail, release), renew, a handler's transaction ending
in ``complete_in``, and ``ctx.once``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from autom import App, HandlerContext, Job
from autom.config import Settings
from autom.deps import Deps
from autom.errors import LeaseLost, PermanentError
from autom.jobs.models import NewJob, lease_generation
from autom.jobs.store import Ahead, JobStore
from autom.testing import open_testbed
from autom.worker import WorkerPool
from tests.support.queue import claim_one, complete, complete_in, fail, release, sleeping_handler
from tests.support.service import wait_until

JOB_ROW = "select to_jsonb(j) from jobs j where id = %(id)s"
RECIPIENT_ROW = "select to_jsonb(r) from recipients r where recipient = %(recipient)s"
# what a claim writes, written back from the snapshot (as a crash that lost it leaves them)
RESTORE_JOB = """
update jobs j set status = o.status, attempts = o.attempts, lease = o.lease, locked_until = o.locked_until,
                  updated_at = o.updated_at, claimed_at = o.claimed_at, claimed_by = o.claimed_by,
                  start_ticket = o.start_ticket
  from jsonb_populate_record(null::jobs, %(row)s::jsonb) o where j.id = o.id
"""
RESTORE_RECIPIENT = """
update recipients r set busy_until = o.busy_until, busy_job = o.busy_job, last_served = o.last_served,
                        next_due_at = o.next_due_at, ver = o.ver
  from jsonb_populate_record(null::recipients, %(row)s::jsonb) o where r.recipient = o.recipient
"""


async def snapshot(db: Any, job_id: int, recipient: str | None) -> tuple[Any, Any]:
    job = await db.fetch_val(JOB_ROW, {"id": job_id})
    rcpt = None if recipient is None else await db.fetch_val(RECIPIENT_ROW, {"recipient": recipient})
    return job, rcpt


async def lose_the_claim(db: Any, before: tuple[Any, Any], recipient: str | None) -> None:
    """Write the rows back to ``before``, and check they are exactly that again."""
    job, rcpt = before
    await db.execute(RESTORE_JOB, {"row": json.dumps(job)})
    assert await db.fetch_val(JOB_ROW, {"id": job["id"]}) == job
    if recipient is not None:
        await db.execute(RESTORE_RECIPIENT, {"row": json.dumps(rcpt)})
        assert await db.fetch_val(RECIPIENT_ROW, {"recipient": recipient}) == rcpt


@pytest.mark.parametrize("recipient", [None, "chat-7"])
async def test_a_lost_claims_holder_is_fenced_off_after_the_next_claim(db: Any, recipient: str | None) -> None:
    store = JobStore(db, lease_seconds=30)
    job_id = await store.enqueue(NewJob("k", recipient=recipient))
    assert job_id is not None
    # claimed once and given back: the lost claim below is the job's second generation
    await release(store, [j for j in await store.claim(1)])
    before = await snapshot(db, job_id, recipient)
    lost = await claim_one(store)
    assert lost is not None and lost.id == job_id and lost.generation == 2
    await lose_the_claim(db, before, recipient)

    fresh = await claim_one(store)
    assert fresh is not None and fresh.id == job_id
    # the same generation (the lost claim left no trace), never the same value
    assert fresh.generation == lost.generation == 2 and fresh.lease != lost.lease

    assert await complete(store, lost) is False
    assert (await fail(store, lost, RuntimeError("late"))).status == "stale"
    assert (await fail(store, lost, PermanentError("late"))).status == "stale"
    assert await store.renew([lost]) == {}
    assert await release(store, [lost]) == set()
    async with db.transaction() as tx:
        assert await complete_in(store, tx, lost) is False
    row = await store.get(job_id)
    assert row is not None and (row["status"], row["lease"], row["attempts"]) == ("running", fresh.lease, 1)

    # the holder of the new claim is untouched by all of it
    assert set(await store.renew([fresh])) == {job_id}
    assert await complete(store, fresh) is True
    assert (await store.get(job_id) or {})["status"] == "done"


async def test_a_lost_claims_handler_commits_nothing_and_records_no_once_key(dsn: str) -> None:
    """Through the worker's own path: the crash happens while the handler runs, another
    process claims the job again, then the handler's ``ctx.once`` and its transaction
    (ended by ``complete_in``) are turned away."""
    app = App(builtins=False)
    seen: dict[str, Any] = {}

    @app.handler("charge")
    async def charge(ctx: HandlerContext, job: Job) -> None:
        bed = seen["bed"]
        seen["lost"] = job
        await lose_the_claim(bed.db, seen["before"], None)
        again = await claim_one(JobStore(bed.db, lease_seconds=60))  # another replica's claim
        assert again is not None and again.id == job.id
        seen["fresh"] = again
        async with ctx.transaction() as tx:
            await tx.execute("insert into notes values (%s)", [job.id])
        with pytest.raises(LeaseLost):
            async with ctx.once(f"charge:{job.id}") as todo:
                assert todo

    async with open_testbed(app, database_url=dsn) as bed:
        await bed.db.execute("create table notes (job_id bigint)")
        seen["bed"] = bed
        job_id = await bed.deps.store.enqueue(NewJob("charge"))
        assert job_id is not None
        seen["before"] = await snapshot(bed.db, job_id, None)
        run = await bed.run(job_id)
        lost, fresh = seen["lost"], seen["fresh"]
        assert lost.generation == fresh.generation == 1 and lost.lease != fresh.lease
        # the completion with the handler's writes was fenced off: nothing committed
        assert run.status == "running" and run.once_keys == []
        assert await bed.db.fetch_val("select count(*) from notes") == 0
        row = await bed.deps.store.get(job_id)
        assert row is not None and row["lease"] == fresh.lease
        assert await complete(bed.deps.store, fresh) is True


def test_the_generation_is_the_high_bits_and_old_leases_count_on() -> None:
    assert lease_generation(0) == 0 and lease_generation(7) == 7  # written before migrations/0014
    assert lease_generation((8 << 32) | 0xFFFFFFFF) == 8
    assert lease_generation(1 << 32) == 1


async def test_the_next_lease_counts_the_generation_and_draws_the_low_bits(db: Any) -> None:
    rows = await db.fetch_all(
        "select autom_lease_next(l) as next, autom_lease_generation(autom_lease_next(l)) as gen"
        " from (values (0::bigint), (7), ((3::bigint << 32) | 5)) v (l), generate_series(1, 200)")
    gens = [r["gen"] for r in rows]
    assert sorted(set(gens)) == [1, 4, 8]  # 0 → 1, an old lease 7 → 8, generation 3 → 4
    assert all(r["next"] >= 1 << 32 for r in rows)
    # the low bits are drawn: 600 values from 2^32, all different (a repeat: ~4e-5)
    assert len({r["next"] for r in rows}) == len(rows)


class CrashingStore(JobStore):
    """A server crash right after each asynchronous claim answered: the claimed rows go
    back to what they were before it (its WAL was never flushed)."""

    def __init__(self, db: Any, **kwargs: Any) -> None:
        super().__init__(db, **kwargs)
        self.lost: list[Job] = []
        self.durable_claims = 0

    async def claim(self, n: int = 1, *, durable: bool = True, ahead: Ahead | None = None) -> list[Job]:
        if durable:
            jobs = await super().claim(n, durable=durable, ahead=ahead)
            self.durable_claims += 1
            return jobs
        due = await self.db.fetch_all("select id, recipient from jobs where due_at <= now()")
        before = {r["id"]: await snapshot(self.db, r["id"], r["recipient"]) for r in due}
        jobs = await super().claim(n, durable=durable, ahead=ahead)
        for job in jobs:
            await lose_the_claim(self.db, before[job.id], job.recipient)
        self.lost.extend(jobs)
        return jobs


class NoTelegram:
    async def alert_job_failed(self, *args: Any) -> bool:
        return True


@pytest.mark.parametrize("recipient", [None, "chat-7"])
async def test_the_worker_stops_the_run_of_an_idle_claim_lost_in_a_crash(db: Any, recipient: str | None,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The worker's idle-path claim commits asynchronously; the server loses it. Its
    confirmation finds the job without that claim, and the handler is stopped at once,
    before anyone could claim the job again (not at a renewal), writing nothing. The job
    is as it was: the next claim runs it, under another lease of the same generation."""
    store = CrashingStore(db, lease_seconds=30)
    long, ended = sleeping_handler()

    deps = Deps(settings=Settings(workers=2), db=db, store=store, sources={},
                telegram=NoTelegram())  # type: ignore[arg-type]
    pool = WorkerPool(deps, {"k": long}, workers=2, poll_seconds=10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await wait_until(lambda: store.durable_claims == 1)  # its first claim (a batch) found nothing
        job_id = await store.enqueue(NewJob("k", recipient=recipient))
        deps.doorbell.set()
        with trio.fail_after(5):
            await wait_until(lambda: ended != [])
        deps.shutdown.value = True
    (lost,) = store.lost
    assert lost.id == job_id and ended == ["cancelled"] and pool.confirmer.confirmations == 1
    # the operator reads why: not a renewal's failure
    stopped = [r.getMessage() for r in caplog.records if "stopped the handler" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].startswith("claim lost"), stopped
    row = await store.get(job_id)
    assert row is not None and (row["status"], row["attempts"], row["lease"]) == ("pending", 0, 0)
    again = await claim_one(store)
    assert again is not None and again.id == job_id
    assert again.generation == lost.generation == 1 and again.lease != lost.lease
    assert await complete(store, lost) is False and await complete(store, again) is True
