"""Console benchmark: how fast the console's pages answer with 1,000,000 jobs in the table.

    python bench/console.py [--jobs 1000000] [--events 200000] [--requests 30] [--out FILE]

What one run does:

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL) and
   applies the migrations (dropped at the end unless ``--keep-db``);
2. seeds ``--events`` events and ``--jobs`` jobs with ``generate_series`` in a few
   statements (bounded: no loop per row), shaped like a service that ran for a week:
   6 kinds, 10,000 recipients, every 10th job from an event; 94 % done, 3 % failed
   (with an error), 2 % pending, 0.5 % running, 0.5 % cancelled; finished jobs spread
   over the last 7 days, about 6,000 in the last hour; then ``vacuum analyze``;
3. serves the real HTTP app (``create_app``, ``serve_http``) on 127.0.0.1, logs in
   to the console as a person would (POST /ui/login with ADMIN_TOKEN) and fetches
   the pages round-robin (each round every page once; one warm-up round, then
   ``--requests`` rounds), one request at a time, timing the whole answer (httpx, on
   this machine): the load of a shared machine falls on every page alike.

Pages: the overview; the jobs list unfiltered; the failed jobs of every kind and of
one kind; the done jobs of one kind (a count far past the cap: "about N"); one
recipient's jobs; a kind's page deep in the table (keyset ``before`` at the middle
id); a recipient's timeline (its page), and a busy recipient's (20,000 jobs: its first
page and its 200th); the bulk retry's confirm page for one kind;
the events list; the audit trail (2,000 actions, a few on the timeline's recipient).
The "(baseline)" pages are pages of these with the console's counting changed
in-process (the overview estimating as it did before, one EXPLAIN per count past the
cap; lists without "N job(s) match"), in the same rounds: their ratio is what it
costs. Target: every page under 200 ms (p95). Every result is one JSON line (stdout
and ``--out``), with the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ADMIN_DSN = os.environ.get("AUTOM_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
TOKEN = "bench-admin-token-0123456789"
KINDS = ["telegram.message", "telegram.send", "site.form", "github.event", "stripe.event", "heartbeat"]

SEED_EVENTS = """
insert into events (source, headers, body, dedup_key, received_at)
select 'site', '{"content-type": "application/json"}'::jsonb,
       '{"id": "' || g || '", "name": "customer ' || g || '", "email": "c' || g || '@example.com"}',
       'evt-' || g, now() - make_interval(secs => (%(events)s - g) * 604800.0 / %(events)s)
from generate_series(1, %(events)s) g
"""

# Status by g % 1000: 0-19 pending, 20-24 running, 25-54 failed, 55-59 cancelled, the rest done.
SEED_JOBS = """
insert into jobs (kind, payload, status, attempts, max_attempts, run_at, locked_until, last_error, key,
                  event_id, recipient, created_at, updated_at, finished_at, claimed_at)
select (%(kinds)s::text[])[1 + g %% 6],
       jsonb_build_object('n', g, 'text', 'message number ' || g),
       s.status,
       case s.status when 'pending' then 0 when 'failed' then 8 else 1 end,
       8,
       t.created,
       case s.status when 'running' then now() + interval '60 seconds' end,
       case s.status when 'failed'
            then 'PermanentError: telegram sendMessage: HTTP 400 Bad Request: chat not found' end,
       case when g %% 10 = 0 then 'job-' || g end,
       case when g %% 10 = 0 then 1 + (g / 10) %% %(events)s end,
       case when g %% 6 < 2 then 'r' || (g %% 10000) end,
       t.created, t.created,
       case when s.status in ('done', 'failed', 'cancelled') then t.created + interval '2 seconds' end,
       case when s.status in ('done', 'failed', 'running') then t.created + interval '1 second' end
from generate_series(1, %(jobs)s) g
cross join lateral (select case when g %% 1000 < 20 then 'pending' when g %% 1000 < 25 then 'running'
                                when g %% 1000 < 55 then 'failed' when g %% 1000 < 60 then 'cancelled'
                                else 'done' end as status) s
cross join lateral (select now() - make_interval(secs => (%(jobs)s - g) * 604800.0 / %(jobs)s) as created) t
"""


# Every failed job's attempts (8 each: 7 retries, the failure), and 2,000 operator actions, a few of them on
# the recipient whose timeline is measured.
SEED_ATTEMPTS = """
insert into job_attempts (job_id, attempt, started_at, ended_at, outcome, error)
select j.id, a, j.created_at, j.created_at + interval '1 second', case when a = 8 then 'failed' else 'retry' end,
       'TransientError: telegram sendMessage: HTTP 502 Bad Gateway'
from jobs j cross join generate_series(1, 8) a
where j.status = 'failed'
"""
# A busy recipient: 20,000 jobs over the week (400 pages of its timeline), every other one from an
# event, every 10th with a retried attempt before it was done.
SEED_BUSY = """
insert into jobs (kind, payload, status, attempts, max_attempts, run_at, recipient, event_id,
                  created_at, updated_at, finished_at, claimed_at)
select 'telegram.send', jsonb_build_object('chat_id', 777, 'text', 'update ' || g), 'done',
       case when g %% 10 = 0 then 2 else 1 end, 8, t.at, 'r-busy',
       case when g %% 2 = 0 then 1 + g %% %(events)s end, t.at, t.at, t.at + interval '2 seconds',
       t.at + interval '1 second'
from generate_series(1, 20000) g
cross join lateral (select now() - make_interval(secs => (20000 - g) * 30.0) as at) t
"""
SEED_BUSY_ATTEMPTS = """
insert into job_attempts (job_id, attempt, started_at, ended_at, outcome, error)
select id, 1, created_at, created_at + interval '1 second', 'retry',
       'TransientError: telegram sendMessage: HTTP 502 Bad Gateway'
from jobs where recipient = 'r-busy' and attempts = 2
"""
SEED_AUDIT = """
insert into audit_log (at, via, action, target, detail)
select now() - make_interval(secs => g * 300), 'console',
       case when g %% 4 = 0 then 'recipient_pause' else 'retry' end,
       case when g %% 40 = 0 then 'recipient:r4242' when g %% 4 = 0 then 'recipient:r' || (g %% 10000)
            else 'job:' || g * 97 end, null
from generate_series(1, 2000) g
"""


def emit(rec: dict[str, Any], out: str | None) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def log(msg: str) -> None:
    print(f"[console-bench] {msg}", file=sys.stderr, flush=True)


def seed(dsn: str, jobs: int, events: int) -> dict[str, float]:
    """Seed the tables (a few statements); returns the seconds each step took."""
    import psycopg

    took: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("set statement_timeout = '10min'")
        for name, query in (("events", SEED_EVENTS), ("jobs", SEED_JOBS), ("attempts", SEED_ATTEMPTS),
                            ("busy recipient", SEED_BUSY), ("busy attempts", SEED_BUSY_ATTEMPTS),
                            ("audit", SEED_AUDIT)):
            started = time.perf_counter()
            conn.execute(query, {"jobs": jobs, "events": events, "kinds": KINDS})
            took[f"seed_{name}_s"] = round(time.perf_counter() - started, 1)
            log(f"seeded {name} in {took[f'seed_{name}_s']} s")
        started = time.perf_counter()
        conn.execute("vacuum analyze")
        took["vacuum_s"] = round(time.perf_counter() - started, 1)
        started = time.perf_counter()
        conn.execute("analyze jobs (kind, status)")  # what migrations/0032 does on a table with jobs
        took["analyze_kind_status_s"] = round(time.perf_counter() - started, 2)
        took["jobs_in_table"] = conn.execute("select count(*) from jobs").fetchone()[0]  # type: ignore[index]
        took["middle_id"] = conn.execute("select id from jobs order by id offset %s limit 1",
                                         [jobs // 2]).fetchone()[0]  # type: ignore[index]
        took["busy_middle_id"] = conn.execute("select id from jobs where recipient = 'r-busy' order by id "
                                              "offset 10000 limit 1").fetchone()[0]  # type: ignore[index]
    return took


async def measure(dsn: str, requests: int, middle_id: int, busy_middle_id: int) -> list[dict[str, Any]]:
    """Serve the app, log in, time each page ``requests`` times (after one warm-up)."""
    import httpx
    import trio

    from autom.config import Settings
    from autom.db import open_database
    from autom.deps import Deps
    from autom.jobs.store import JobStore
    from autom.sources import enabled_sources
    from autom.web import create_app, serve_http

    settings = Settings(database_url=dsn, admin_token=TOKEN, host="127.0.0.1", log_level="warning")
    pages = {
        "overview": "/ui/",
        "jobs, no filter": "/ui/jobs",
        "failed jobs, every kind": "/ui/jobs?status=failed",
        "failed jobs of one kind": "/ui/jobs?status=failed&kind=telegram.message",
        "done jobs of one kind": "/ui/jobs?status=done&kind=telegram.message",
        "one recipient's jobs": "/ui/jobs?recipient=r4242",
        "a kind, deep page (keyset)": f"/ui/jobs?kind=site.form&before={middle_id}",
        "a recipient's timeline": "/ui/recipients/r4242",
        "a busy recipient's timeline (20,000 jobs), first page": "/ui/recipients/r-busy",
        "a busy recipient's timeline, page 200 of 400 (keyset)": f"/ui/recipients/r-busy?before={busy_middle_id}",
        "bulk retry's count of one kind": "/ui/retry-failed?kind=telegram.message",
        "bulk retry's count of every failed job, by kind": "/ui/retry-failed",
        "events": "/ui/events",
        "audit": "/ui/audit",
    }
    from autom import ops
    from autom.ops import Operations

    @contextlib.contextmanager
    def explain_each() -> Iterator[None]:
        """The overview as it estimated before: one EXPLAIN per count past the cap (18 here), not
        the statistics read in its counting statement."""
        saved = Operations.overview_counts

        async def one_explain_each(self: Operations, cap: int, statement_seconds: float) -> Any:
            counts = await saved(self, cap, statement_seconds)
            for kind, cells in counts.items():
                for status, cell in cells.items():
                    if cell.capped:
                        params = {**ops.JobFilter(kind=kind, status=status).params(), "before": None,
                                  "limit": ops._NO_LIMIT}
                        plan = await self.db.fetch_val(ops._ESTIMATE_OF[ops.Q.ops_list_jobs], params)
                        cells[status] = ops.Capped(cell.n, cap, ops._plan_rows(plan))
            return counts

        Operations.overview_counts = one_explain_each  # type: ignore[method-assign]
        try:
            yield
        finally:
            Operations.overview_counts = saved  # type: ignore[method-assign]

    @contextlib.contextmanager
    def no_count() -> Iterator[None]:
        async def none(*_: Any, **__: Any) -> None:
            raise ops.QueryError("counting turned off by the bench")

        saved = Operations.count_jobs
        Operations.count_jobs = none  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            Operations.count_jobs = saved  # type: ignore[method-assign]

    baselines = {
        "overview (baseline: one EXPLAIN per count past the cap)": ("/ui/", explain_each),
        "failed jobs of one kind (baseline: no count)": (pages["failed jobs of one kind"], no_count),
        "done jobs of one kind (baseline: no count)": (pages["done jobs of one kind"], no_count),
        "jobs, no filter (baseline: no count)": (pages["jobs, no filter"], no_count),
    }
    results = []
    async with open_database(dsn, min_size=2, max_size=8) as db:
        deps = Deps(settings=settings, db=db, store=JobStore(db), sources=enabled_sources(settings), telegram=None)
        app = create_app(deps)
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(partial(serve_http, deps, app, binds=["127.0.0.1:0"]))
            async with httpx.AsyncClient(base_url=urls[0], timeout=30.0) as client:
                login = await client.post("/ui/login", data={"token": TOKEN})
                assert login.status_code == 303, login.text
                # round-robin: each round fetches every page once, so a load that comes and goes on
                # this shared machine falls on every page alike; the "(baseline)" pages are the same
                # page with the console's counting turned off (no estimate, no count), for the ratio
                variants = {**{name: (path, None) for name, path in pages.items()}, **baselines}
                times: dict[str, list[float]] = {name: [] for name in variants}
                warm: dict[str, httpx.Response] = {}
                for round_ in range(requests + 1):
                    for name, (path, patch) in variants.items():
                        with patch() if patch is not None else contextlib.nullcontext():
                            started = time.perf_counter()
                            response = await client.get(path)
                            took = (time.perf_counter() - started) * 1000
                        assert response.status_code == 200, (path, response.status_code, response.text[:300])
                        if round_ == 0:
                            warm[name] = response  # the warm-up, not timed
                        else:
                            times[name].append(took)
                for name, (path, _) in variants.items():
                    ts = sorted(times[name])
                    rec = {
                        "system": "autom", "test": "console_page", "page": name, "path": path,
                        "requests": requests, "p50_ms": round(statistics.median(ts), 1),
                        "p95_ms": round(ts[max(0, int(len(ts) * 0.95) - 1)], 1),
                        "max_ms": round(ts[-1], 1), "bytes": len(warm[name].content),
                        "capped_counts": ">1,000+<" in warm[name].text,
                        "estimated_counts": "about " in warm[name].text,
                        "load_1min": round(os.getloadavg()[0], 2),
                    }
                    results.append(rec)
                    log(f"{name}: p50 {rec['p50_ms']} ms, p95 {rec['p95_ms']} ms, max {rec['max_ms']} ms")
            deps.shutdown.value = True
            nursery.cancel_scope.cancel()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--admin-dsn", default=ADMIN_DSN)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not 1 <= args.jobs <= 5_000_000 or not 1 <= args.events <= 1_000_000 or not 1 <= args.requests <= 1000:
        parser.error("--jobs 1..5,000,000, --events 1..1,000,000, --requests 1..1000 (the run stays bounded)")
    sys.path.append(str(HERE.parent))
    import trio
    from drain import bench_database  # bench/drain.py: a fresh migrated database, dropped at the end

    with bench_database(args.admin_dsn, "console", args.keep_db) as dsn:
        took = seed(dsn, args.jobs, args.events)
        emit({"system": "autom", "test": "console_seed", "jobs": args.jobs, "events": args.events, **took,
              "load_1min": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
             args.out)
        for rec in trio.run(measure, dsn, args.requests, took["middle_id"], took["busy_middle_id"]):
            emit({**rec, "jobs": args.jobs}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
