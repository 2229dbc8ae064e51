"""A handler never outlives its lease, and the pool survives its claims being taken back.

The database really goes away (``tests/support/restartable_pg.py``): with a 2 s
lease and a handler that would run on, renewals fail for longer than the lease.
Before the fix the same process claimed its own expired job again and ran it a
second time while the first run was still going; the first run's clean-up then
removed the second run's bookkeeping and a ``KeyError`` took the pool down.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from autom.config import Settings
from autom.db import open_database
from autom.deps import Deps
from autom.jobs.models import Job, NewJob
from autom.jobs.store import JobStore
from autom.worker import WorkerPool
from tests.support.restartable_pg import RestartablePg, restartable_pg

LEASE = 2.0


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


class NoTelegram:
    """No handler here talks to Telegram."""


def make_pool(db: Any, handlers: dict[str, Any], *, workers: int = 2) -> WorkerPool:
    store = JobStore(db, lease_seconds=LEASE)
    deps = Deps(settings=Settings(workers=workers), db=db, store=store, sources={},
                telegram=NoTelegram())  # type: ignore[arg-type]
    return WorkerPool(deps, handlers, workers=workers, poll_seconds=0.2)


async def test_renewals_failing_longer_than_the_lease_stop_the_run_before_it_is_claimed_again(
    pg: RestartablePg,
) -> None:
    runs: list[dict[str, Any]] = []  # one entry per handler run: attempt, lease, how it ended
    active: set[int] = set()  # job ids whose handler runs now
    overlaps: list[int] = []
    first_started = trio.Event()

    async def long(ctx: Any, job: Job) -> None:
        if job.id in active:
            overlaps.append(job.id)
        active.add(job.id)
        entry: dict[str, Any] = {"attempt": job.attempts, "lease": job.lease, "end": "running"}
        runs.append(entry)
        try:
            if job.attempts == 1:
                first_started.set()
                await trio.sleep(5)  # a 5 s handler on a 2 s lease: it lives on renewals
            entry["end"] = "returned"
        except trio.Cancelled:
            entry["end"] = "cancelled"
            raise
        finally:
            active.discard(job.id)

    async with open_database(pg.dsn, min_size=1, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db:
        job_id = await JobStore(db).enqueue(NewJob("long"))
        pool = make_pool(db, {"long": long})
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(pool.run)
                await first_started.wait()
                await trio.to_thread.run_sync(pg.stop)
                # the database stays away until the lease has certainly run out (renewals
                # fail for 2.7 s after the last one that could have succeeded): that is the
                # scenario, not a wait for a condition
                await trio.sleep(LEASE + 0.7)
                await trio.to_thread.run_sync(pg.start)
                # the job is claimed again (attempt 2) and done
                while True:
                    row = await db.fetch_one("select status, attempts from jobs where id = %s", [job_id])
                    if row is not None and row["status"] == "done":
                        break
                    await trio.sleep(0.05)
                pool.deps.shutdown.value = True
    assert overlaps == [], f"the same job ran twice at once in one process: {runs}"
    assert [r["attempt"] for r in runs] == [1, 2]
    # the first run was stopped at its local deadline, before the lease ran out
    assert runs[0]["end"] == "cancelled"
    assert runs[1]["end"] == "returned"
    assert dict(row) == {"status": "done", "attempts": 2}
