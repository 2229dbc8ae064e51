"""A claim taking over an expired lease and the outcome writer settling that same job
cannot deadlock (the lock order recipients → jobs, as the claim's); nor a renewal of
that lease, nor an operator's retry of a pending job the claim takes (below).

The claim locks a recipient's row (``for update skip locked``), then updates the
recipient's head job. ``settle_many`` used to update its jobs first and lock their
recipients' rows after (its ``held`` walk): when a job's lease ran out while its
outcome was being written, the claim could hold the recipient and wait for the job,
and the settle hold the job and wait for the recipient, a deadlock PostgreSQL breaks
only after ``deadlock_timeout`` by failing one of them.

Made to happen without timing: the claimant's transaction locks the recipient first,
the settle starts and is seen waiting (``pg_stat_activity``), then the claim runs in
that transaction. Before, the settle held the job by then: the claim waited for it,
and one of the two failed with a deadlock. Now the settle waits for the recipient
holding no job row, the claim takes the job over and commits, and the settle finds
the lease gone (it settles nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

from autom.db.queries import Q
from tests.support.locks import run_until_it_waits

RECIPIENT = "deadlock-r"
#: a hang guard, not a timing: the settle is seen waiting long before this
HANG_SECONDS = 60


def _enqueue(setup: psycopg.Connection[Any]) -> int:
    [(job,)] = setup.execute("select * from autom_enqueue(%s::jsonb)",
                             (json.dumps([{"kind": "test.deadlock", "payload": {}, "recipient": RECIPIENT}]),)
                             ).fetchall()
    return int(job)


def _claim_while_it_waits(dsn: str, claimer: psycopg.Connection[Any], claimant: int,
                          other: psycopg.Connection[Any], work: Callable[[], Any]) -> tuple[list[Any], Any]:
    """The claimer's transaction locks the recipient; ``work`` (the other writer's statement on
    ``other``) starts and is seen waiting; then the claim runs in the claimer's transaction
    (it updates the recipient's head job next) and commits. Returns the claim's rows and what
    ``work`` returned; fails if ``work`` failed (a deadlock: one of the two is failed)."""
    claimer.execute("select 1 from recipients where recipient = %s for update", (RECIPIENT,))
    try:
        thread, result = run_until_it_waits(dsn, other, work, HANG_SECONDS)
        claimed = claimer.execute(Q.claim, {"n": 1, "claimant": claimant, "now_n": 1, "ticket": 0,
                                            "lease_seconds": 30.0, "durable": True}).fetchall()
        claimer.commit()
    finally:
        claimer.rollback()  # after a failure: the recipient freed, the other goes on
    thread.join(HANG_SECONDS)
    assert "error" not in result, result
    return claimed, result["rows"]


def test_a_claim_taking_over_a_job_being_settled_does_not_deadlock_with_the_settle(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup:
        job = _enqueue(setup)
        # claimed, and its lease ran out while its outcome is on its way
        [(lease,)] = setup.execute(
            "update jobs set status = 'running', attempts = 1, lease = 7, claimed_at = now() - interval '1 hour',"
            " locked_until = now() - interval '1 minute' where id = %s returning lease", (job,)).fetchall()
        setup.execute("update recipients set busy_until = now() - interval '1 minute', busy_job = %s,"
                      " next_due_at = now() - interval '1 minute' where recipient = %s", (job, RECIPIENT))
        [(claimant,)] = setup.execute(Q.claimant_register).fetchall()
        with psycopg.connect(dsn) as claimer, psycopg.connect(dsn) as settler:
            claimed, settled = _claim_while_it_waits(dsn, claimer, claimant, settler, lambda: settler.execute(
                Q.settle_many, {"ids": [job], "leases": [lease], "outcomes": ["retry"], "errors": ["boom"],
                                "delays": [60.0], "refused": [False], "unrun": [False], "tracebacks": [None],
                                "logs": [None], "max_defer": 3600.0}).fetchall())
        assert [row[0] for row in claimed] == [job]  # taken over
        assert settled == []  # its lease gone: the settle writes nothing
        row = setup.execute("select status, lease <> %s from jobs where id = %s", (lease, job)).fetchone()
        assert row == ("running", True)


def test_a_claim_taking_over_a_job_being_renewed_does_not_deadlock_with_the_renewal(dsn: str) -> None:
    """The same for ``renew_many``, which used to update its jobs first and lock their
    recipients after. Its window: the renewal's transaction began while the lease still
    ran (``now()`` is the transaction's start), the claim's after it ran out; made without
    timing by setting the lease to end just after the renewal's transaction began."""
    with psycopg.connect(dsn, autocommit=True) as setup, psycopg.connect(dsn) as renewer:
        job = _enqueue(setup)
        [(began,)] = renewer.execute("select now()").fetchall()  # the renewal's transaction, begun
        ends = "%s::timestamptz + interval '1 millisecond'"
        [(lease,)] = setup.execute(
            f"update jobs set status = 'running', attempts = 1, lease = 7, claimed_at = now() - interval '1 hour',"
            f" locked_until = {ends} where id = %s returning lease", (began, job)).fetchall()
        setup.execute(f"update recipients set busy_until = {ends}, busy_job = %s,"
                      " next_due_at = now() - interval '1 minute' where recipient = %s", (began, job, RECIPIENT))
        [(claimant,)] = setup.execute(Q.claimant_register).fetchall()
        with psycopg.connect(dsn) as claimer:
            # the claim's transaction begins after the lease ran out
            [(ran_out,)] = claimer.execute(f"select now() > {ends}", (began,)).fetchall()
            assert ran_out
            claimed, renewed = _claim_while_it_waits(dsn, claimer, claimant, renewer, lambda: renewer.execute(
                Q.renew_many, {"ids": [job], "leases": [lease], "lease_seconds": 30.0}).fetchall())
        assert [row[0] for row in claimed] == [job]  # taken over
        assert renewed == []  # the renewal finds its claim lost
        row = setup.execute("select status, lease <> %s, locked_until > now() + interval '20 seconds'"
                            " from jobs where id = %s", (lease, job)).fetchone()
        assert row == ("running", True, True)


def test_a_claim_of_a_pending_job_an_operator_retries_does_not_deadlock_with_the_retry(dsn: str) -> None:
    """And for the operator's retry (``ops_retry_jobs``: one pending job may be retried, its
    attempts reset), which used to update the job first and upsert its recipient after."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        job = _enqueue(setup)
        setup.execute("update recipients set next_due_at = now() - interval '1 minute' where recipient = %s",
                      (RECIPIENT,))
        [(claimant,)] = setup.execute(Q.claimant_register).fetchall()
        with psycopg.connect(dsn) as claimer, psycopg.connect(dsn) as operator:
            claimed, retried = _claim_while_it_waits(dsn, claimer, claimant, operator, lambda: operator.execute(
                Q.ops_retry_jobs, {"ids": [job], "statuses": ["failed", "cancelled", "pending"]}).fetchall())
        assert [row[0] for row in claimed] == [job]
        assert retried == []  # running by then: not the operator's to retry (409)
        row = setup.execute("select status, attempts from jobs where id = %s", (job,)).fetchone()
        assert row == ("running", 1)
