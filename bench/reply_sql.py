"""The webhook → reply path's statements alone, in PostgreSQL: migrations up to N against all of them.

    .venv/bin/python bench/reply_sql.py [--upto N] [--n 1500] [--rounds 3] [--wal 30]
                                        [--setup-sql FILE] [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

Makes two throwaway databases on ``--dsn``'s server, one migrated up to ``--upto`` (by
default the migration before the last) and one with every migration, and runs on each,
from one connection, the statements an idle ``autom run`` sends for one Telegram
``/ping`` (bench/reply.py), with the parameters it sends (as the server's log shows them):

1. ``intake_store_handoff``: the update's event and its job, stored claimed (before the 202);
2. ``telegram_acquire``: the reply's send right (Telegram's limits, migrations/0009-0033),
   with intervals so small that every send goes at once (the path of an idle chat);
3. ``complete_many`` and ``retire_lines``: the job done, its chat's line retired (after
   the reply).

``--n`` updates over 100 chats per round, the two databases interleaved update by update,
``--rounds`` rounds. Each statement is timed by the client (``perf_counter`` around a
prepared execute); both connections commit with ``synchronous_commit = off``, so what is
compared is the statements' work, not the WAL flush. Prints one JSON line per database
and statement: the median and the 10th percentile over all updates, µs; and, for
``--wal`` updates at the end, the WAL records and bytes each statement's transaction
wrote (pg_walinspect, filtered by the transaction's xid, so other sessions' WAL does not
count).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from autom.db.migrate import apply_pending, available_migrations
from autom.db.queries import Q

CHATS = 100
KINDS = ["telegram.send", "telegram.message", "telegram.callback", "telegram.edited"]
STEPS = ("store", "take", "complete", "retire")


def database(dsn: str, name: str, upto: int | None) -> str:
    """A new database ``name`` with the migrations numbered up to ``upto`` (None: all); its DSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    target = psycopg.conninfo.make_conninfo(dsn, dbname=name)
    with psycopg.connect(target, autocommit=True) as conn, conn.transaction():
        apply_pending(conn, [m for m in available_migrations() if upto is None or m.version <= upto])
        conn.execute("create extension if not exists pg_walinspect")
    return target


def store_params(update_id: int, chat: int) -> dict[str, Any]:
    """``intake_store_handoff``'s parameters for a ``/ping`` from ``chat`` (as autom run sends them)."""
    body = {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1700000000, "text": "/ping", "chat": {"id": chat, "type": "private"},
        "from": {"id": chat, "is_bot": False, "first_name": "Bench"}}}
    job = {"key": f"telegram:{update_id}", "kind": "telegram.message", "trace": None, "run_at": None,
           "payload": {"from": {"id": chat}, "text": "/ping", "chat_id": chat, "update_id": update_id,
                       "message_id": update_id},
           "event_id": None, "recipient": str(chat), "max_attempts": 8}
    return {"until": None, "source": "telegram",
            "headers": json.dumps({"host": "127.0.0.1:8000", "content-type": "application/json"}),
            "body": json.dumps(body), "dedup_key": str(update_id), "jobs": json.dumps([job]),
            "token": str(uuid.uuid4()), "lease_seconds": 60.0}


def one_update(conn: psycopg.Connection[Any], update_id: int, wal: bool) -> tuple[list[float], list[Any]]:
    """The four statements for one update; their times (s) and, with ``wal``, their (xid, lsn, lsn)."""
    chat = 7_000_000 + update_id % CHATS
    times: list[float] = []
    marks: list[Any] = []

    def run(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        before = conn.execute("select pg_current_wal_insert_lsn() as lsn").fetchone()["lsn"] if wal else None  # type: ignore[index]
        start = time.perf_counter()
        cur = conn.execute(query, params, prepare=True)
        rows = cur.fetchall() if cur.description is not None else []
        times.append(time.perf_counter() - start)
        if wal:
            after = conn.execute("select pg_current_wal_insert_lsn() as lsn").fetchone()["lsn"]  # type: ignore[index]
            marks.append([before, after])
        return rows  # type: ignore[return-value]

    (stored,) = run(Q.intake_store_handoff, store_params(update_id, chat))
    job, lease = stored["id"], stored["lease"]
    if job is None:
        raise RuntimeError(f"update {update_id}: its job was not handed off ({stored})")
    run(Q.telegram_acquire, {"chat": str(chat), "parts": 1, "chat_interval": 1e-6, "global_interval": 1e-7,
                             "burst": 30.0, "priority": False, "job": job, "line": str(chat),
                             "line_kinds": KINDS})
    done = run(Q.complete_many, {"ids": [job], "leases": [lease], "upto": 0, "claimant": None, "durable": False})
    idle = [r["idle"] for r in done if r["idle"] is not None]
    run(Q.retire_lines, {"recipients": idle})
    if wal:
        # each statement's own transaction: the event's, the budget row's, the job's xmin
        xids = conn.execute(
            "select (select xmin::text::bigint from events where id = %(ev)s) as store,"
            " (select xmin::text::bigint from telegram_budget) as take,"
            " (select xmin::text::bigint from jobs where id = %(job)s) as complete",
            {"ev": stored["event_id"], "job": job}).fetchone()
        for mark, xid in zip(marks, [*xids.values(), None], strict=True):  # type: ignore[union-attr]
            mark.append(xid)
    return times, marks


def wal_of(conn: psycopg.Connection[Any], marks: list[Any]) -> tuple[int, int]:
    """WAL records and bytes of transaction ``xid`` between the two LSNs (its commit record included)."""
    before, after, xid = marks
    if xid is None:
        return 0, 0
    row = conn.execute("select count(*) as n, coalesce(sum(record_length), 0) as size"
                       " from pg_get_wal_records_info(%s, %s) where xid::text::bigint = %s",
                       [before, after, xid]).fetchone()
    return int(row["n"]), int(row["size"])  # type: ignore[index]


def main() -> None:
    """Run the comparison and print one JSON line per database and statement."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--upto", type=int, default=None,
                        help="the older database's last migration (default: the one before the last)")
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wal", type=int, default=30, help="updates at the end whose WAL is counted")
    parser.add_argument("--setup-sql", default=None, help="SQL run in the newer database after its migrations"
                        " (a variant to try before it is a migration)")
    args = parser.parse_args()
    if args.upto is None:
        args.upto = [m.version for m in available_migrations()][-2]
    tag = uuid.uuid4().hex[:6]
    names = {f"upto {args.upto}": f"autom_reply_sql_old_{tag}", "all": f"autom_reply_sql_new_{tag}"}
    uptos = {f"upto {args.upto}": args.upto, "all": None}
    try:
        dsns = {label: database(args.dsn, name, uptos[label]) for label, name in names.items()}
        if args.setup_sql:
            with psycopg.connect(dsns["all"], autocommit=True) as conn:
                conn.execute(Path(args.setup_sql).read_bytes())
        conns = {label: psycopg.connect(dsn, autocommit=True, row_factory=dict_row) for label, dsn in dsns.items()}
        for conn in conns.values():
            conn.execute("set synchronous_commit = off")
        times: dict[str, list[list[float]]] = {label: [[] for _ in STEPS] for label in conns}
        wal: dict[str, list[list[tuple[int, int]]]] = {label: [[] for _ in STEPS] for label in conns}
        update_id = 0
        for _round in range(args.rounds):
            for i in range(args.n):
                update_id += 1
                order = list(conns) if i % 2 else list(reversed(conns))
                for label in order:
                    took, _ = one_update(conns[label], update_id, wal=False)
                    for k, t in enumerate(took):
                        times[label][k].append(t)
        marked: list[tuple[str, int, Any]] = []
        for _i in range(args.wal):
            update_id += 1
            for label, conn in conns.items():
                _, marks = one_update(conn, update_id, wal=True)
                marked += [(label, k, mark) for k, mark in enumerate(marks)]
        time.sleep(1.0)  # the WAL writer flushes asynchronous commits (pg_walinspect reads flushed WAL only)
        for label, k, mark in marked:
            wal[label][k].append(wal_of(conns[label], mark))
        for label in conns:
            for k, step in enumerate(STEPS):
                values = sorted(times[label][k])
                records = [w[0] for w in wal[label][k]] or [0]
                size = [w[1] for w in wal[label][k]] or [0]
                print(json.dumps({"db": label, "statement": step, "n": len(values),
                                  "median_us": round(statistics.median(values) * 1e6, 1),
                                  "p10_us": round(values[len(values) // 10] * 1e6, 1),
                                  "wal_records": statistics.median(records), "wal_bytes": statistics.median(size)}))
        for conn in conns.values():
            conn.close()
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            for name in names.values():
                admin.execute(f'drop database if exists "{name}" with (force)')


if __name__ == "__main__":
    main()
