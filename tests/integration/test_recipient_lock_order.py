"""Every writer of several recipients' rows takes them in recipient order (issue 26).

The intake's batch (``autom_enqueue``), a handler's jobs (``autom_enqueue_each``), the
completer's other outcomes (``settle_many``) and its lease renewals (``renew_many``)
each write the rows of several recipients in one transaction. Taken in no fixed order
(a hash, a join's), two of them storing or settling jobs of the same two chats could
each hold one row and wait for the other's: a deadlock, which PostgreSQL breaks only
after ``deadlock_timeout`` (1 s) by failing one of them, a second's tail for the
deliveries of that batch.

Here another transaction holds the row of the recipient first in order. The
statement under test, for that recipient and 19 more, then waits for it (seen in
``pg_stat_activity``, not timed) and must hold none of the others meanwhile: a third
connection locks all 19 with NOWAIT. Taken in any other order the statement holds some
of them already, and the NOWAIT fails. The jobs are made in the reverse of recipient
order, so that neither their ids nor the input's order gives recipient order by
chance. When the holder commits, the statement completes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors

from autom.db.queries import Q
from tests.support.locks import run_until_it_waits

RECIPIENTS = [f"o-{i:02d}" for i in range(20)]
#: a hang guard, not a timing: the statement is seen waiting long before this
HANG_SECONDS = 60


def jobs_json(kind: str, recipients: list[str]) -> str:
    return json.dumps([{"kind": kind, "payload": {}, "recipient": r} for r in recipients])


def running_jobs(conn: psycopg.Connection[Any]) -> tuple[list[int], list[int]]:
    """One job per recipient, made in reverse recipient order and held as running (a claim's lease)."""
    ids = [row[0] for row in conn.execute(
        "select * from autom_enqueue(%s::jsonb)", (jobs_json("test.lock_order", RECIPIENTS[::-1]),)).fetchall()]
    rows = conn.execute(
        "update jobs set status = 'running', attempts = 1, lease = 7, claimed_at = now(),"
        " locked_until = now() + interval '1 hour' where id = any (%s) returning id, lease", (ids,)).fetchall()
    conn.execute("update recipients r set busy_until = j.locked_until, busy_job = j.id"
                 " from jobs j where j.id = any (%s) and r.recipient = j.recipient", (ids,))
    return [r[0] for r in rows], [r[1] for r in rows]


def enqueue(conn: psycopg.Connection[Any], ids: list[int], leases: list[int]) -> int:
    rows = conn.execute("select * from autom_enqueue(%s::jsonb)",
                        (jobs_json("test.lock_order_next", RECIPIENTS[::-1]),)).fetchall()
    return len(rows)


def enqueue_each(conn: psycopg.Connection[Any], ids: list[int], leases: list[int]) -> int:
    rows = conn.execute(Q.enqueue_each, {"jobs": jobs_json("test.lock_order_next", RECIPIENTS[::-1])}).fetchall()
    return len(rows)


def settle(conn: psycopg.Connection[Any], ids: list[int], leases: list[int]) -> int:
    n = len(ids)
    rows = conn.execute(Q.settle_many, {
        "ids": ids, "leases": leases, "outcomes": ["retry"] * n, "errors": ["boom"] * n, "delays": [60.0] * n,
        "refused": [False] * n, "unrun": [False] * n, "tracebacks": [None] * n, "logs": [None] * n,
        "max_defer": 3600.0,
    }).fetchall()
    return len(rows)


def renew(conn: psycopg.Connection[Any], ids: list[int], leases: list[int]) -> int:
    return len(conn.execute(Q.renew_many, {"ids": ids, "leases": leases, "lease_seconds": 30.0}).fetchall())


@pytest.mark.parametrize("statement", [enqueue, enqueue_each, settle, renew], ids=lambda f: f.__name__)
def test_a_writer_of_several_recipients_takes_their_rows_in_order(
        dsn: str, statement: Callable[[psycopg.Connection[Any], list[int], list[int]], int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup:
        ids, leases = running_jobs(setup)
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as writer, psycopg.connect(dsn) as third:
        holder.execute("select 1 from recipients where recipient = %s for no key update", (RECIPIENTS[0],))
        try:
            # the writer reaches the held row and waits for it
            thread, result = run_until_it_waits(dsn, writer, lambda: statement(writer, ids, leases), HANG_SECONDS)
            # ... holding none of the other recipients' rows meanwhile
            try:
                locked = third.execute("select recipient from recipients where recipient = any (%s)"
                                       " for no key update nowait", (RECIPIENTS[1:],)).fetchall()
            except errors.LockNotAvailable:
                pytest.fail(f"{statement.__name__} held other recipients' rows while it waited for the first's")
            assert len(locked) == len(RECIPIENTS) - 1
            third.rollback()
        finally:
            holder.commit()
        thread.join(HANG_SECONDS)
        assert "error" not in result, result
        assert result["rows"] == len(RECIPIENTS)
