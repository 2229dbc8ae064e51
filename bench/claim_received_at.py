"""Job.received_at in the claim: A/B of the claim statement with and without its events probe.

    python bench/claim_received_at.py   (AUTOM_BENCH_ADMIN_DSN: default the local PostgreSQL)

20,000 due jobs, each with an event of its own or none, over no recipient or 1,000; 120
claims of 63 by each statement, interleaved, each rolled back (the backlog stays the same);
client-side ms per statement, median and 10th percentile of the last 100. Results in
bench/RESULTS.md, "Job.received_at".
"""

from __future__ import annotations

import os
import statistics
import time
import uuid

import psycopg
from psycopg.rows import dict_row

from autom.db.migrate import apply_migrations_sync
from autom.db.queries import Q

ADMIN = os.environ.get("AUTOM_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
PROBE = "select c.*, (select e.received_at from events e where e.id = c.event_id) as received_at\nfrom claimed c, sync"
PARAMS = {"n": 63, "lease_seconds": 60.0, "durable": True, "claimant": None, "ticket": 0, "now_n": 63}


def backlog(dsn: str, *, events: bool, recipients: int) -> None:
    """20,000 due no-op jobs (with an event each, or none), statistics taken."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("truncate jobs, recipients, events restart identity cascade")
        recipient = "null" if recipients == 0 else f"'r' || (g % {recipients})"
        conn.execute("select autom_enqueue(jsonb_agg(jsonb_build_object('kind', 'noop', 'payload', '{}'::jsonb, "
                     f"'recipient', {recipient}))) from generate_series(1, 20000) g")
        if events:
            conn.execute("insert into events (source, headers, body) "
                         "select 'bench', '{}', '{}' from generate_series(1, 20000)")
            conn.execute("update jobs set event_id = id")
        for table in ("jobs", "events", "recipients"):
            conn.execute(f"vacuum analyze {table}")


def main() -> None:
    """Both statements on each backlog; one line per backlog."""
    new = Q.claim
    assert PROBE in new, "the claim's final select changed: update PROBE"
    base = new.replace(PROBE, "select c.* from claimed c, sync")
    name = f"claimbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"create database {name}")
    dsn = psycopg.conninfo.make_conninfo(ADMIN, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        for events in (False, True):
            for recipients in (0, 1000):
                backlog(dsn, events=events, recipients=recipients)
                times: dict[str, list[float]] = {"base": [], "received_at": []}
                with psycopg.connect(dsn, row_factory=dict_row) as conn:
                    for i in range(120):
                        order = [("base", base), ("received_at", new)]
                        for label, sql in order if i % 2 else order[::-1]:
                            start = time.perf_counter()
                            rows = conn.execute(sql, PARAMS).fetchall()
                            times[label].append((time.perf_counter() - start) * 1000)
                            assert len(rows) == 63
                            conn.rollback()
                figures = {label: f"median {statistics.median(ms[20:]):.3f} ms, "
                                  f"p10 {statistics.quantiles(ms[20:], n=10)[0]:.3f} ms"
                           for label, ms in times.items()}
                print(f"events={events} recipients={recipients}: {figures}", flush=True)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f"drop database {name} with (force)")


if __name__ == "__main__":
    main()
