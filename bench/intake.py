"""Intake benchmark: signed Telegram webhooks per second, beside the same server's no-database rate.

    python bench/intake.py [--duration 4] [--rounds 3] [--levels 1,16,64] [--pool-size 16]

What it does:

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL 15)
   and applies the migrations;
2. starts the intake alone (no workers, no ticker) in a child process: this file
   with ``serve``, i.e. ``open_database`` + ``create_app`` + ``serve_http`` on
   127.0.0.1 with a pool of ``--pool-size`` connections (``autom run`` opens
   WORKERS + 8), logging JSON lines at info to a file, as the service would;
3. drives it with ``wrk`` (one thread, N connections = N concurrent senders;
   ``apt-get install wrk``). A Lua script builds every request: a Telegram
   ``message`` update with a unique ``update_id`` (so each is a new event with
   one job) and the secret-token header. The no-database route is the same
   request with a wrong token: routing, the door's header proof (Telegram's
   secret is checked before the body is read), a log line, a 401 on the same
   keep-alive connection (the door's failing-client block is lifted for it), and
   no database;
4. for each concurrency level runs ``--rounds`` alternating rounds (no-DB, then
   intake, ``--duration`` seconds each: alternating keeps the comparison fair on a
   machine that is doing other things too) and prints a table: requests/s,
   p50/p90/p99/max latency, CPU per request of the server, of PostgreSQL (this database's
   backends and the background processes) and of wrk, how busy the machine was
   with other work meanwhile (all cores = 100 %: the noise), intake as a share of
   the no-DB rate and the p99 ratio;
5. checks that the database holds exactly one event and one job per 202,
   stops the server with SIGTERM and drops the database.

The target (issue): intake ≥ 70 % of the no-DB rate and p99 ≤ 1.5 × the no-DB
p99 at 16 senders. Results go to bench/RESULTS.md by hand, with the date,
versions and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

SECRET = "bench-telegram-secret"

WRK_SCRIPT = r"""
-- args: mode (intake | nodb), secret, nonce (makes update ids unique across runs)
local counter = 0
local mode, token, nonce
local nthreads = 0

function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end

function init(args)
  mode = args[1]
  token = args[2]
  if mode == "nodb" then token = "wrong-" .. token end
  nonce = tonumber(args[3])
end

function request()
  counter = counter + 1
  local uid = nonce + tid * 10000000 + counter
  local chat = 100000 + (uid % 1000)   -- 1000 chats: recipients rows are spread, as in real life
  local body = string.format(
    '{"update_id":%d,"message":{"message_id":%d,"date":1700000000,' ..
    '"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,"first_name":"Bench"},' ..
    '"text":"/ping"}}', uid, counter, chat, chat)
  return wrk.format("POST", "/hooks/telegram",
    {["Content-Type"] = "application/json", ["X-Telegram-Bot-Api-Secret-Token"] = token}, body)
end
"""

#: The ``done`` of every wrk script of these benchmarks (``wrk_result`` reads its line): requests,
#: duration (µs), non-2xx answers, socket errors, p50, p90, p99 and max latency (µs).
WRK_DONE = r"""
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d %d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""
WRK_SCRIPT += WRK_DONE


# --- the server (child process) ---------------------------------------------------------


@asynccontextmanager
async def bench_app(dsn: str, pool_size: int) -> AsyncIterator[tuple[Any, Any]]:
    """``(deps, app)``: the service's HTTP app over a pool of ``pool_size`` on ``dsn``, as the
    intake benchmarks run it (Telegram's secret ``SECRET``; the door's lockout of a client that
    keeps failing verification off). Also bench/intake_cpu.py's."""
    from autom.admission import FailingClients
    from autom.config import Settings
    from autom.db import open_database
    from autom.deps import Deps
    from autom.jobs.store import JobStore
    from autom.sources import enabled_sources
    from autom.web import create_app

    settings = Settings(telegram_webhook_secret=SECRET, host="127.0.0.1", shutdown_grace_seconds=5)
    async with open_database(dsn, min_size=pool_size, max_size=pool_size, pool_timeout=5.0) as db:
        deps = Deps(settings=settings, db=db, store=JobStore(db), sources=enabled_sources(settings),
                    telegram=None)  # type: ignore[arg-type]
        app = create_app(deps)
        admission = app.extensions.get("autom.admission")
        if admission is not None:
            # The no-DB route fails verification on purpose, thousands of times: without
            # this, after FAIL_LIMIT failures the door blocks 127.0.0.1 and that route
            # measures a 429 with a new connection per request instead of the 401.
            admission.failing = FailingClients(limit=10**9)
        yield deps, app


def serve(dsn: str, pool_size: int, log_file: str) -> None:
    """Run the intake alone until SIGTERM; print ``READY <url>`` once it listens."""
    import logging
    from functools import partial

    import trio

    from autom.logs import JsonFormatter
    from autom.web import serve_http

    handler = logging.FileHandler(log_file)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)  # as autom.logs.configure_logging
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)

    async def main() -> None:
        async with bench_app(dsn, pool_size) as (deps, app), trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, deps)
            urls = await nursery.start(partial(serve_http, deps, app, binds=["127.0.0.1:0"]))
            print("READY", urls[0], flush=True)

    async def _stop_on_signal(deps: Any) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                deps.shutdown.value = True
                return

    trio.run(main)


# --- the driver ---------------------------------------------------------------------------


@dataclass
class Run:
    """One wrk run."""

    route: str
    senders: int
    requests: int
    seconds: float
    non_2xx: int
    socket_errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    cpu_ms_per_request: float
    pg_cpu_ms_per_request: float
    wrk_cpu_ms_per_request: float
    others_busy: float  # share of all cores busy with other work during the run (noise)

    @property
    def rate(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_pids(admin_dsn: str, dbname: str) -> list[int]:
    """The server's processes that work for this benchmark: the backends connected to
    ``dbname`` (the app's pool) and the background processes (WAL writer, checkpointer...),
    not other databases' backends (tests may share the server)."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select pid from pg_stat_activity where (datname = %s or backend_type <> 'client backend')"
            " and pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return [row[0] for row in rows]


def app_backends(admin_dsn: str, dbname: str) -> list[int]:
    """The client backends connected to ``dbname``."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select pid from pg_stat_activity where datname = %s and backend_type = 'client backend'"
            " and pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return [row[0] for row in rows]


def postgres_cpu_seconds(pids: list[int]) -> float:
    """CPU time so far of ``pids`` (one that exited counts as 0: compare sets taken together)."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def system_busy_seconds() -> float:
    """Busy CPU time of the whole machine so far (all cores: user, nice, system, irq, softirq)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def wrk_result(cmd: list[str], nice: int = 0) -> tuple[int, ...]:
    """Run ``cmd`` (wrk with a script ending in ``WRK_DONE``); its RESULT line's numbers."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         preexec_fn=(lambda: os.nice(nice)) if nice else None).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result:\n{out}")
    return tuple(int(x) for x in line.split()[1:])


def run_wrk(
    url: str, script: str, mode: str, senders: int, duration: float, server_pid: int, pg_pids: list[int],
    nice: int = 0,
) -> Run:
    """One wrk run against ``url``; ``mode`` is ``intake`` or ``nodb``."""
    nonce = (int(time.time() * 1000) % 10**6) * 10**9
    cmd = ["wrk", "-t1", f"-c{senders}", f"-d{duration:g}s", "--timeout", "10s", "-s", script, url,
           "--", mode, SECRET, str(nonce)]
    cpu_before, pg_before, busy_before = cpu_seconds(server_pid), postgres_cpu_seconds(pg_pids), system_busy_seconds()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    requests, duration_us, non_2xx, sock_err, p50, p90, p99, mx = wrk_result(cmd, nice)
    wall = time.monotonic() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_used = cpu_seconds(server_pid) - cpu_before
    pg_used = postgres_cpu_seconds(pg_pids) - pg_before
    busy_total = system_busy_seconds() - busy_before
    wrk_used = (children.ru_utime + children.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    # what the rest of the machine did meanwhile, as a share of all cores: the noise indicator
    others = max(0.0, busy_total - cpu_used - pg_used - wrk_used) / wall / (os.cpu_count() or 1)
    return Run(
        route=mode, senders=senders, requests=requests, seconds=duration_us / 1e6, non_2xx=non_2xx,
        socket_errors=sock_err, p50_ms=p50 / 1000, p90_ms=p90 / 1000, p99_ms=p99 / 1000, max_ms=mx / 1000,
        cpu_ms_per_request=1000 * cpu_used / max(1, requests),
        pg_cpu_ms_per_request=1000 * pg_used / max(1, requests),
        wrk_cpu_ms_per_request=1000 * wrk_used / max(1, requests),
        others_busy=others,
    )


def combine(rounds: list[Run]) -> Run:
    """Rounds of one (route, senders) as one: requests and time summed, per-request CPU
    weighted by requests, latencies the median of the rounds' (wrk cannot merge histograms)."""
    total = sum(r.requests for r in rounds) or 1

    def weighted(name: str) -> float:
        return sum(getattr(r, name) * r.requests for r in rounds) / total

    return Run(
        route=rounds[0].route, senders=rounds[0].senders, requests=sum(r.requests for r in rounds),
        seconds=sum(r.seconds for r in rounds), non_2xx=sum(r.non_2xx for r in rounds),
        socket_errors=sum(r.socket_errors for r in rounds),
        p50_ms=statistics.median(r.p50_ms for r in rounds), p90_ms=statistics.median(r.p90_ms for r in rounds),
        p99_ms=statistics.median(r.p99_ms for r in rounds),
        max_ms=max(r.max_ms for r in rounds), cpu_ms_per_request=weighted("cpu_ms_per_request"),
        pg_cpu_ms_per_request=weighted("pg_cpu_ms_per_request"),
        wrk_cpu_ms_per_request=weighted("wrk_cpu_ms_per_request"),
        others_busy=statistics.mean(r.others_busy for r in rounds),
    )


def versions() -> str:
    """The versions that matter for this benchmark."""
    names = ["trio", "hypercorn", "quart", "quart-trio", "psycopg"]
    parts = [f"Python {platform.python_version()}"] + [f"{n} {metadata.version(n)}" for n in names]
    return ", ".join(parts)


def machine() -> str:
    """CPU model and count, memory."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
    return f"{os.cpu_count()} × {model}, {mem_kb / 1024 / 1024:.0f} GiB RAM, {platform.system()} {platform.release()}"


def drive(args: argparse.Namespace) -> int:
    """Create the database, start the server, run the table, clean up."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from autom.db.migrate import apply_migrations_sync

    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 1
    levels = [int(x) for x in args.levels.split(",")]
    nice = -args.priority
    dbname = f"autom_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{dbname}"')
        server_version = conn.execute("show server_version").fetchone()[0]  # type: ignore[index]
    dsn = make_conninfo(args.admin_dsn, dbname=dbname)
    tmp = Path(tempfile.mkdtemp(prefix="autom-bench-"))
    server: subprocess.Popen[str] | None = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        script = tmp / "telegram.lua"
        script.write_text(WRK_SCRIPT)
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", "--dsn", dsn, "--pool-size", str(args.pool_size),
             "--log-file", str(tmp / "server.log")],
            stdout=subprocess.PIPE, text=True, preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
        assert server.stdout is not None
        ready = server.stdout.readline().split()
        if not ready or ready[0] != "READY":
            print("the server did not start", file=sys.stderr)
            return 1
        url = ready[1]
        if args.pause:
            print(f"server pid {server.pid} at {url}; press Enter to run", flush=True)
            input()

        for mode in ("nodb", "intake"):  # warm-up: imports, pool, caches, first JIT of wrk's Lua
            run_wrk(url, str(script), mode, 16, 2, server.pid, [], nice)
        pg_pids = postgres_pids(args.admin_dsn, dbname)
        if nice:
            # only this benchmark's own backends (the app's pool), never the server's other processes
            for pid in app_backends(args.admin_dsn, dbname):
                os.setpriority(os.PRIO_PROCESS, pid, nice)
        runs: list[Run] = []
        for senders in levels:
            # Short alternating rounds: on a shared machine, both routes then see the same
            # background load, and the ratio between them stays meaningful.
            for round_no in range(args.rounds):
                for mode in ("nodb", "intake"):
                    run = run_wrk(url, str(script), mode, senders, args.duration, server.pid, pg_pids, nice)
                    runs.append(run)
                    print(f"  {mode:6} c={senders:<3} round {round_no + 1}: {run.rate:7.0f}/s  "
                          f"p50 {run.p50_ms:6.2f} ms  p90 {run.p90_ms:6.2f} ms  p99 {run.p99_ms:6.2f} ms  "
                          f"max {run.max_ms:6.1f} ms  CPU ms/req: server "
                          f"{run.cpu_ms_per_request:.2f} postgres {run.pg_cpu_ms_per_request:.2f} "
                          f"wrk {run.wrk_cpu_ms_per_request:.2f}  other load {100 * run.others_busy:.0f} %",
                          flush=True)

        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        with psycopg.connect(dsn, autocommit=True) as conn:
            events = conn.execute("select count(*) from events").fetchone()[0]  # type: ignore[index]
            jobs = conn.execute("select count(*) from jobs").fetchone()[0]  # type: ignore[index]

        print()
        print(f"{time.strftime('%Y-%m-%d')}; {versions()}; PostgreSQL {server_version}")
        print(machine())
        print(f"wrk 1 thread; per level {args.rounds} alternating rounds of {args.duration:g} s per route "
              f"(rates: all rounds' requests / time; latencies: median of the rounds); "
              f"pool {args.pool_size} connections"
              + (f", priority raised by {args.priority}" if args.priority else ""))
        print()
        print("| senders | route | req/s | p50 ms | p90 ms | p99 ms | max ms | CPU ms/req: server | postgres | wrk "
              "| other load | vs no-DB rate | p99 vs no-DB |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        combined = {(senders, route): combine([r for r in runs if (r.senders, r.route) == (senders, route)])
                    for senders in levels for route in ("nodb", "intake")}
        for senders in levels:
            base = combined[(senders, "nodb")]
            for route in ("nodb", "intake"):
                r = combined[(senders, route)]
                share = f"{100 * r.rate / base.rate:.0f} %" if route == "intake" else ""
                p99 = f"{r.p99_ms / base.p99_ms:.2f}×" if route == "intake" else ""
                label = "no-DB (401)" if route == "nodb" else "intake (202)"
                print(f"| {senders} | {label} | {r.rate:.0f} | {r.p50_ms:.2f} | {r.p90_ms:.2f} | {r.p99_ms:.2f} "
                      f"| {r.max_ms:.1f} | "
                      f"{r.cpu_ms_per_request:.2f} | {r.pg_cpu_ms_per_request:.2f} | {r.wrk_cpu_ms_per_request:.2f} "
                      f"| {100 * r.others_busy:.0f} % | {share} | {p99} |")
        if args.out:  # one JSON line per (senders, route), for bench/speed.py
            from drain import emit  # bench/ is this script's folder, first on sys.path

            import autom

            for r in combined.values():  # r.route: "nodb" or "intake"
                emit({"system": "autom", "test": "intake", "variant": args.variant, "rounds": args.rounds,
                      "autom_src": str(Path(autom.__file__).parent),
                      "duration_s": args.duration, **r.__dict__, "rate": r.rate,
                      "load_1min": os.getloadavg()[0]}, args.out)
        accepted = sum(r.requests - r.non_2xx for r in runs if r.route == "intake")
        print()
        print(f"events stored {events}, jobs {jobs}; 202s in the measured runs {accepted} (+ warm-up)")
        problems = [r for r in runs if r.socket_errors or (r.route == "intake" and r.non_2xx)]
        if events != jobs or problems:
            print(f"PROBLEM: events {events} != jobs {jobs} or errors in {problems}", file=sys.stderr)
            return 1
        print(json.dumps({"runs": [r.__dict__ | {"rate": round(r.rate, 1)} for r in runs]}), file=sys.stderr)
        return 0
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
        if not args.keep_db:
            with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
                conn.execute(f'drop database if exists "{dbname}" with (force)')
        shutil.rmtree(tmp, ignore_errors=True)


# --- the database hop alone (``python bench/intake.py hop``) --------------------------------


def hop(args: argparse.Namespace) -> int:
    """CPU time and rate of the intake's database hop alone, in its variants (no HTTP).

    ``select 1`` is the floor of any hop (thread, pool, round trip). ``transaction`` is
    the first design: ``db.transaction()`` with the event insert and ``insert_jobs`` (BEGIN,
    two statements, COMMIT: four round trips). ``statement`` is one ``intake_store``
    statement (a delivery that found no hop in flight). ``batch of 8 / 16`` is the
    group commit: one ``intake_store_many`` statement storing that many deliveries in
    one hop and one transaction (StoreBatcher, autom/events/batcher.py).
    """
    import itertools

    import psycopg
    import trio
    from psycopg.conninfo import make_conninfo

    from autom.db import open_database
    from autom.db.migrate import apply_migrations_sync
    from autom.db.queries import Q
    from autom.events import batch_items, store_params
    from autom.jobs.models import NewJob
    from autom.jobs.store import insert_jobs

    counter = itertools.count(1)

    def delivery() -> tuple[str, list[NewJob]]:
        uid = next(counter)
        chat = {"id": 100000 + uid % 1000}
        update = {"update_id": uid, "message": {"message_id": uid, "chat": chat, "text": "/ping"}}
        job = NewJob(kind="telegram.message", payload={"update_id": uid, "chat_id": 100000 + uid % 1000,
                                                       "text": "/ping", "message_id": uid, "from": None},
                     key=f"telegram:{uid}", recipient=str(100000 + uid % 1000))
        return json.dumps(update), [job]

    headers = {"content-type": "application/json", "host": "127.0.0.1:8000", "content-length": "170"}

    async def transaction(db: Any, body: str, jobs: list[NewJob]) -> None:
        async with db.transaction() as tx:
            # the first design's event insert (it lived in queries_intake.sql then)
            row = await tx.fetch_one(
                "insert into events (source, headers, body, dedup_key) values (%(source)s, %(headers)s::jsonb,"
                " %(body)s, %(dedup_key)s) on conflict (source, dedup_key) do nothing returning id",
                store_params("telegram", headers, body, body[:20], []),
            )
            assert row is not None
            await insert_jobs(tx, [NewJob(**{**j.__dict__, "event_id": row["id"]}) for j in jobs])

    async def measure(db: Any, name: str, tasks: int, per_task: int, per_call: int, call: Any) -> None:
        async def worker() -> None:
            for _ in range(per_task):
                await call()

        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        events = tasks * per_task * per_call
        cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        print(f"| {name} | {tasks} | {events / elapsed:.0f} | {1000 * cpu / events:.2f} |", flush=True)

    async def run_all(dsn: str) -> None:
        async with open_database(dsn, min_size=8, max_size=16) as db:
            async def select1() -> None:
                await db.fetch_val("select 1")

            async def tx() -> None:
                body, jobs = delivery()
                await transaction(db, body, jobs)

            async def statement() -> None:
                body, jobs = delivery()
                await db.fetch_one(Q.intake_store, store_params("telegram", headers, body, body[:20], jobs))

            def batch_of(size: int) -> Any:
                async def batch() -> None:
                    items = []
                    for _ in range(size):
                        body, jobs = delivery()
                        items.append(store_params("telegram", headers, body, body[:20], jobs))
                    rows = await db.fetch_all(Q.intake_store_many, {"items": batch_items(items)})
                    assert len(rows) == size

                return batch

            print("| hop | concurrent | events/s | process CPU ms/event |")
            print("|---|---:|---:|---:|")
            for _ in range(args.rounds):
                for name, call, per_call in (("select 1 (floor)", select1, 1), ("transaction, 4 round trips", tx, 1),
                                             ("one statement (a lone delivery)", statement, 1)):
                    await measure(db, name, 1, 150, per_call, call)
                    await measure(db, name, 16, 40, per_call, call)
                for size in (8, 16):
                    await measure(db, f"batch of {size}: one intake_store_many (group commit)", 1, 40, size,
                                  batch_of(size))

    dbname = f"autom_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{dbname}"')
    try:
        dsn = make_conninfo(args.admin_dsn, dbname=dbname)
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        trio.run(run_all, dsn)
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{dbname}" with (force)')
    return 0


def main() -> int:
    """Command line: ``drive`` (default), ``hop`` (the database hop alone), ``serve`` (the child process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command")
    srv = sub.add_parser("serve", help="(internal) run the intake server")
    srv.add_argument("--dsn", required=True)
    srv.add_argument("--pool-size", type=int, default=16)
    srv.add_argument("--log-file", default=os.devnull)
    sub.add_parser("hop", help="measure the database hop alone, in its variants (no HTTP)")
    parser.add_argument("--admin-dsn", default=os.environ.get("AUTOM_BENCH_ADMIN_DSN",
                                                              "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating no-DB/intake rounds per level")
    parser.add_argument("--levels", default="1,16,64", help="concurrent senders, comma-separated")
    parser.add_argument("--pool-size", type=int, default=16,
                        help="database connections of the server (autom run: WORKERS + 8)")
    parser.add_argument("--priority", type=int, default=0,
                        help="raise the server's, wrk's and the app's backends' priority by N (root; a shared machine)")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the benchmark database")
    parser.add_argument("--pause", action="store_true", help="wait for Enter before measuring (attach py-spy)")
    parser.add_argument("--out", default=None, help="also append the combined figures as JSON lines to this file")
    parser.add_argument("--variant", default=None, help="which autom this is, stored with --out's lines")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.dsn, args.pool_size, args.log_file)
        return 0
    if args.command == "hop":
        return hop(args)
    return drive(args)


if __name__ == "__main__":
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: an older checkout can be run
    sys.exit(main())
