"""The enqueue functions' own cost in PostgreSQL: ``autom_enqueue`` before and after 0022, and ``autom_enqueue_each``.

Makes two throwaway databases on ``--dsn``'s server, one migrated up to 0021 and one
with every migration, and calls each function from one connection: 600 calls of one
job (prepared) and 5 calls of 1,000 jobs, ``--rounds`` times interleaved. Prints one
JSON line per function: the minimum and the median over the rounds, ms per call.

    .venv/bin/python bench/enqueue_sql.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import psycopg

from autom.db.migrate import apply_pending, available_migrations

ONE = json.dumps([{"kind": "k", "payload": {"a": 1}}])
BATCH = json.dumps([{"kind": "k", "payload": {"a": i}} for i in range(1000)])
ENQUEUE = "select autom_enqueue as id from autom_enqueue(%s::jsonb)"
EACH = "select pos, id, existing from autom_enqueue_each(%s::jsonb) order by pos"


def database(dsn: str, name: str, upto: int) -> str:
    """A new database ``name`` with the migrations numbered up to ``upto``; its DSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    target = psycopg.conninfo.make_conninfo(dsn, dbname=name)
    with psycopg.connect(target, autocommit=True) as conn, conn.transaction():
        apply_pending(conn, [m for m in available_migrations() if m.version <= upto])
    return target


def timed(dsn: str, query: str) -> tuple[float, float]:
    """ms per call of one job and of 1,000 jobs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        for _ in range(600):
            conn.execute(query, [ONE], prepare=True).fetchall()
        one = (time.perf_counter() - start) / 600 * 1000
        start = time.perf_counter()
        for _ in range(5):
            conn.execute(query, [BATCH]).fetchall()
        return one, (time.perf_counter() - start) / 5 * 1000


def main() -> None:
    """Run the rounds and print the figures; the databases are dropped at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a server the bench may create databases on")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    names = [f"bench_enq_{uuid.uuid4().hex[:8]}_{n}" for n in ("before", "after")]
    try:
        before, after = database(args.dsn, names[0], 21), database(args.dsn, names[1], 10_000)
        calls = {"autom_enqueue before 0022": (before, ENQUEUE), "autom_enqueue": (after, ENQUEUE),
                 "autom_enqueue_each": (after, EACH)}
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, (dsn, query) in calls.items():
                got[name].append(timed(dsn, query))
        for name, runs in got.items():
            ones, batches = [r[0] for r in runs], [r[1] for r in runs]
            print(json.dumps({"function": name, "one_job_ms_min": round(min(ones), 3),
                              "one_job_ms_median": round(statistics.median(ones), 3),
                              "1000_jobs_ms_min": round(min(batches), 2),
                              "1000_jobs_ms_median": round(statistics.median(batches), 2)}))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(f'drop database if exists "{name}"')


if __name__ == "__main__":
    main()
