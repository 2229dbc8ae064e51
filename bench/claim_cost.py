"""The claim statement alone: this checkout's against an older copy's, on one backlog.

    python bench/claim_cost.py 1000|none OLD_QUERIES_SQL [--admin-dsn DSN]

20,000 jobs (over 1,000 recipients, or none) in a fresh database with this checkout's
migrations; 300 claims of 63 of each of the two statements, interleaved, each in a
transaction rolled back (so every claim sees the same backlog); prints the median and
the 10th percentile of the client's time per call, in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import psycopg

from autom.db.migrate import apply_migrations_sync
from autom.db.queries import Q, Queries


def main() -> None:
    """Run the comparison and print one line per statement."""
    parser = argparse.ArgumentParser()
    parser.add_argument("recipients", choices=["1000", "none"])
    parser.add_argument("old_queries", help="queries.sql of the older copy")
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    old = Queries(Path(args.old_queries).read_text()).claim
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute("drop database if exists autom_claim_cost")
        admin.execute("create database autom_claim_cost")
        dsn = args.admin_dsn.rsplit("/", 1)[0] + "/autom_claim_cost"
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                print(args.recipients, measure(conn, old, Q.claim, args.recipients == "1000"))
        finally:
            admin.execute("drop database autom_claim_cost")


def measure(conn: psycopg.Connection[tuple[object, ...]], old: str, new: str, recipients: bool) -> str:
    """Both statements' times on a backlog of 20,000 jobs."""
    apply_migrations_sync(conn)
    jobs = [{"kind": "noop", "payload": {}, "recipient": f"r{i % 1000}" if recipients else None}
            for i in range(20000)]
    conn.execute("select autom_enqueue(%s::jsonb)", [json.dumps(jobs)])
    conn.execute("vacuum analyze")
    row = conn.execute("insert into worker_starts default values returning id").fetchone()
    assert row is not None
    before = {"n": 63, "lease_seconds": 60.0, "durable": True}
    after = {**before, "claimant": row[0], "ticket": 100, "now_n": 16}
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(300):
        for name, query, params in (("old", old, before), ("new", new, after)):
            conn.execute("begin")
            started = time.perf_counter()
            rows = conn.execute(query, params).fetchall()
            times[name].append(time.perf_counter() - started)
            assert len(rows) == 63, len(rows)
            conn.execute("rollback")
    return "; ".join(f"{name}: median {statistics.median(v) * 1000:.3f} ms, p10 {sorted(v)[30] * 1000:.3f} ms"
                     for name, v in times.items())


if __name__ == "__main__":
    main()
