"""Sustained load against ``autom run``: a closed loop (issue 26's probe) or a fixed offered rate (issue 27's run).

    .venv/bin/python bench/sustained.py [--minutes 10] [--connections 16] [--chats 10000] [--workers 16]
                                        [--base-src DIR] [--rounds 1] [--out DIR] [--admin-dsn DSN]
    .venv/bin/python bench/sustained.py --rate 300 [--minutes 10] [--warmup 5]     the open loop
    .venv/bin/python bench/sustained.py --search [--search-from 100] [--step-seconds 30]

**The open loop** (``--rate R`` or ``--search``; bench/openloop.py): issue 27's sustained
run. A fresh database, the stubs in a process of their own (a Telegram Bot API stub
enforcing Telegram's limits, 429 with retry_after beyond them; a CRM answering after
20 ms) and one ``autom run`` with the App of bench/sustained_app.py (GitHub, Stripe and
site jobs call the CRM; ``/ping`` is answered ``pong``). This process offers R signed
deliveries a second whatever the answers do (wrk2's schedule: a latency counts from when
its request was due): 70 % Telegram updates from ``--chats`` chats (2 % ``/ping``), 10 %
each GitHub, Stripe and site. Per window (the warm-up, then each minute): deliveries due,
answered 202, stored (events, by the due time each carries) and their jobs, the sender's
answer p50/p99, webhook → job start p50/p99/max (the job's first start, its first claim,
minus the delivery's due time; a job deferred by the send limits left out: ``STORED``),
replies the Telegram stub accepted, 429s it gave (goal 0), CRM calls, the server's RSS,
the database's size, the CPU of the server and PostgreSQL and the rest of the machine
(the stubs included), the wait events sampled as below; after the load, the same start
figure per kind and lane and window (``BY_KIND``: which jobs wait when the p99 grows).
``--split`` runs two processes instead of one, ROLE=intake (the deliveries go there)
and ROLE=worker (the jobs), their RSS and CPU summed: one Python process is one core
at most, and this machine has two. ``--intakes N`` (with ``--split``) runs N ROLE=intake
processes, each on its own port, the deliveries going to them in turn, as a load
balancer in front of N replicas would; ``--worker-procs M``, M ROLE=worker processes. A
window holds when every delivery due in it was answered 202 and stored once with one
job, the start's p99 is at most 1 s and no 429 came. After the load: the backlog
drains, and every event has exactly one job and the events equal the 202s. ``--rate``'s
last line is that rate if every minute held (else 0); ``--search`` offers
``--search-from``, then ``--search-factor`` times more per step of ``--step-seconds``
until a step fails (or the backlog does not drain), then halves the gap until it is
within 5 % (10/s); its last line is the highest rate that held. Output: ``table.md``,
``windows.jsonl``.

**The closed loop** (default; issue 26's probe, for as long as asked):

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL) and starts
   one real ``autom run`` on it (WORKERS=``--workers``, LOG_LEVEL info to a file, the
   Telegram stub of tests/support in this process as its Bot API; ``autom run`` applies
   the migrations);
2. ``wrk`` (``--threads`` threads, ``--connections`` connections, a closed loop: each
   connection sends its next request when the answer to the last one came) posts signed
   Telegram ``message`` updates from ``--chats`` chats picked at random, ``"text":"hello"``
   (no reply is asked: the job runs and is done), each with a new ``update_id``; one wrk
   run per minute, back to back, so each minute has its own percentiles; ``--duplicates K``:
   the warm-up stores K updates per wrk thread and every minute sends only those again
   (redeliveries: answered, nothing stored; issue 26's duplicate-only run);
3. reports per minute: the rate answered, the sender's p50/p90/p99/max (wrk's, which
   counts from the request's write to its answer), non-2xx answers, the server's CPU
   (% of one core), PostgreSQL's (this database's backends and the background
   processes), the machine's busy share and load average, and ``pg_stat_activity``
   sampled every 0.25 s: the non-idle backends of this database counted by wait event
   ("CPU" when none), and each lock wait as "statement ⇐ the statement of the backend
   it waits for" (statements named by their first comment line, queries*.sql), so a
   stall names itself;
4. after the load: waits for the backlog to drain, then checks that every 202 was stored
   once (events = their jobs = done jobs, the schedule's own jobs aside; at most
   ``--connections`` more events than 202s per wrk run: requests in flight when wrk
   stopped), stops the server (SIGTERM) and drops the database.

With ``--base-src DIR`` (a checkout of other code, e.g. ``git worktree add /tmp/base
main``) every round also runs that code (``PYTHONPATH=DIR``, its own database),
alternating which goes first, so both see the same machine; compare them only within
one run. It migrates its own database with its own files (a checkout with a top-level
``migrations/`` gets the link ``autom/migrations`` to it, as bench/speed.py does). The machine is
shared: the load average and the busy share of the machine outside this benchmark are
in every row.

The last line is the sustained rate (deliveries answered per second over the run, of
this checkout) with its p50 and p99 over the minutes (the median of the minutes' p50,
the worst minute's p99). Everything lands in ``--out`` (default
``$TMPDIR/autom-sustained-<time>``): ``minutes.jsonl`` (one line per minute), ``table.md``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import trio  # noqa: E402
from drain import base_checkout  # noqa: E402
from intake import (  # noqa: E402
    WRK_DONE,
    cpu_seconds,
    postgres_cpu_seconds,
    postgres_pids,
    system_busy_seconds,
    wrk_result,
)
from psycopg.conninfo import make_conninfo  # noqa: E402

from tests.support.processes import process_env  # noqa: E402
from tests.support.service import SITE_SECRET, TG_SECRET  # noqa: E402
from tests.support.telegram_stub import running_stub  # noqa: E402

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
CHAT_BASE = 700_000_000
SERVING = re.compile(r"autom serving on (http://[0-9.]+:[0-9]+)")
#: the deliveries' jobs (not the schedule's)
EVENT_JOBS = "select count(*) from jobs where event_id is not null"
#: jobs not finished yet
BACKLOG = "select count(*) from jobs where due_at is not null"
#: how often pg_stat_activity is sampled (s)
SAMPLE_SECONDS = 0.25

LUA = r"""
-- args: secret, nonce (update ids unique per wrk run), chats, wrap (0: every update new; K: each
-- thread's counter repeats 1..K, so a run with the nonce of an earlier one sends only its updates again)
local counter = 0
local token, nonce, chats, wrap
local nthreads = 0

function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end

function init(args)
  token = args[1]
  nonce = tonumber(args[2])
  chats = tonumber(args[3])
  wrap = tonumber(args[4] or "0")
  math.randomseed(nonce % 1000003 + tid * 7919)
end

function request()
  counter = counter + 1
  local n = counter
  if wrap > 0 then n = (counter - 1) % wrap + 1 end
  local uid = nonce + tid * 100000000 + n
  local chat = CHAT_BASE + math.random(0, chats - 1)
  local body = string.format(
    '{"update_id":%d,"message":{"message_id":%d,"date":1700000000,' ..
    '"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,"first_name":"Sustained"},' ..
    '"text":"hello"}}', uid, n, chat, chat)
  return wrk.format("POST", "/hooks/telegram",
    {["Content-Type"] = "application/json", ["X-Telegram-Bot-Api-Secret-Token"] = token}, body)
end
""".replace("CHAT_BASE", str(CHAT_BASE)) + WRK_DONE

#: the non-idle backends of one database: wait event ("CPU" when none), statement, and for a
#: lock wait the statement of the first backend it waits for (statements by their first comment line)
ACTIVITY = r"""
select coalesce(a.wait_event_type || '/' || a.wait_event, 'CPU') as event,
       coalesce(substring(a.query from '^\s*--\s*([^\n]{1,60})'),
                left(regexp_replace(a.query, '\s+', ' ', 'g'), 60)) as statement,
       case when a.wait_event_type = 'Lock' then (
           select coalesce(substring(b.query from '^\s*--\s*([^\n]{1,60})'),
                           left(regexp_replace(b.query, '\s+', ' ', 'g'), 60)) || ' (' || b.state || ')'
             from pg_stat_activity b where b.pid = (pg_blocking_pids(a.pid))[1]) end as blocker
from pg_stat_activity a
where a.datname = %s and a.backend_type = 'client backend' and a.state <> 'idle'
  and a.pid <> pg_backend_pid()
"""


@dataclass
class Minute:
    """One minute (one wrk run) of one server."""

    code: str
    round: int
    minute: int
    requests: int = 0
    seconds: float = 0.0
    non_2xx: int = 0
    socket_errors: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    server_cpu_pct: float = 0.0  # of one core
    pg_cpu_pct: float = 0.0  # of one core
    machine_busy_pct: float = 0.0  # all cores = 100
    others_busy_pct: float = 0.0  # busy outside the server, PostgreSQL and wrk (all cores = 100)
    load_1min: float = 0.0
    samples: int = 0
    events: dict[str, int] = field(default_factory=dict)  # wait event: count of backend samples
    lock_waits: dict[str, int] = field(default_factory=dict)  # "statement <= blocker": count

    @property
    def rate(self) -> float:
        """Answers per second."""
        return self.requests / self.seconds if self.seconds else 0.0


class ActivitySampler:
    """Samples ``pg_stat_activity`` of one database every ``SAMPLE_SECONDS`` in a thread; ``take()``
    returns (and resets) the counts since the last take."""

    def __init__(self, dsn: str, dbname: str) -> None:
        self._dsn, self._dbname = dsn, dbname
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._events: collections.Counter[str] = collections.Counter()
        self._locks: collections.Counter[str] = collections.Counter()
        self._samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def take(self) -> tuple[int, dict[str, int], dict[str, int]]:
        with self._lock:
            out = self._samples, dict(self._events), dict(self._locks)
            self._samples, self._events, self._locks = 0, collections.Counter(), collections.Counter()
        return out

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            next_at = time.monotonic()
            while not self._stop.is_set():
                rows = conn.execute(ACTIVITY, (self._dbname,)).fetchall()
                with self._lock:
                    self._samples += 1
                    for event, statement, blocker in rows:
                        self._events[event] += 1
                        if blocker is not None or event.startswith("Lock/"):
                            self._locks[f"{event}: {statement} <= {blocker}"] += 1
                next_at += SAMPLE_SECONDS
                self._stop.wait(max(0.0, next_at - time.monotonic()))


def run_wrk(url: str, script: Path, args: argparse.Namespace, nonce: int, seconds: float,
            wrap: int = 0) -> tuple[int, ...]:
    """One wrk run; its RESULT numbers (requests, µs, non-2xx, socket errors, p50, p90, p99, max µs).
    ``wrap`` > 0: each wrk thread sends updates 1..wrap of ``nonce`` over and over (LUA)."""
    cmd = ["wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{seconds:g}s", "--timeout", "10s",
           "-s", str(script), url, "--", TG_SECRET, str(nonce), str(args.chats), str(wrap)]
    return wrk_result(cmd)


async def wait_serving(proc: trio.Process, log_path: Path) -> str:
    """The URL ``autom run`` logs once it serves (its log file at ``log_path``)."""
    with trio.fail_after(60):
        while True:
            text = await trio.Path(log_path).read_text(errors="replace")
            if proc.returncode is not None:
                raise RuntimeError(f"autom run exited: {text[-3000:]}")
            found = SERVING.search(text)
            if found:
                return found.group(1)
            await trio.sleep(0.1)


def count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute(query).fetchone()[0])  # type: ignore[index]


async def one_server(args: argparse.Namespace, code: str, src: Path, round_no: int, folder: Path,
                     out: list[Minute]) -> dict[str, Any]:
    """Run ``--minutes`` of load against one ``autom run`` of ``src``; append its minutes to ``out``."""
    dbname = f"autom_sustained_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{dbname}"')
    dsn = make_conninfo(args.admin_dsn, dbname=dbname)
    script = folder / "sustained.lua"
    script.write_text(LUA)
    log_path = folder / f"{code}-{round_no}.server.log"
    checks: dict[str, Any] = {"code": code, "round": round_no}
    try:
        async with running_stub() as stub:
            env = process_env(dsn, stub.url, WORKERS=str(args.workers), LOG_LEVEL=args.log_level)
            env["PYTHONPATH"] = str(src)
            with log_path.open("wb") as log_file:
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "autom", "run"], env=env, cwd=str(folder),
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
            try:
                url = await wait_serving(proc, log_path)
                print(f"{code} round {round_no}: autom run pid {proc.pid} at {url} (PYTHONPATH={src})", flush=True)
                # warm-up: imports, pool, plans (its 202s count in the checks, not in the minutes)
                # --duplicates K: the warm-up stores updates 1..K of each wrk thread; every minute then
                # sends those again (the same nonce and wrap): nothing new is stored after the warm-up
                warm_nonce = (round_no * 100 + 99) * 10**9
                warm = await trio.to_thread.run_sync(run_wrk, url, script, args, warm_nonce, args.warmup,
                                                     args.duplicates)
                answered = warm[0] - warm[2]
                wrk_runs = 1
                pg_pids = postgres_pids(args.admin_dsn, dbname)
                sampler = ActivitySampler(args.admin_dsn, dbname)
                sampler.start()
                sampler.take()
                try:
                    for minute in range(1, args.minutes + 1):
                        nonce = warm_nonce if args.duplicates else (round_no * 100 + minute) * 10**9
                        cpu0, pg0, busy0 = cpu_seconds(proc.pid), postgres_cpu_seconds(pg_pids), system_busy_seconds()
                        kids0 = os.times()
                        t0 = time.monotonic()
                        res = await trio.to_thread.run_sync(run_wrk, url, script, args, nonce, args.minute_seconds,
                                                            args.duplicates)
                        wall = time.monotonic() - t0
                        kids1 = os.times()
                        cpu = cpu_seconds(proc.pid) - cpu0
                        pg = postgres_cpu_seconds(pg_pids) - pg0
                        busy = system_busy_seconds() - busy0
                        wrk_cpu = (kids1.children_user + kids1.children_system) - (
                            kids0.children_user + kids0.children_system)
                        samples, events, locks = sampler.take()
                        wrk_runs += 1
                        requests, duration_us, non_2xx, sock, p50, p90, p99, mx = res
                        cores = os.cpu_count() or 1
                        m = Minute(code, round_no, minute, requests, duration_us / 1e6, non_2xx, sock,
                                   p50 / 1e3, p90 / 1e3, p99 / 1e3, mx / 1e3,
                                   100 * cpu / wall, 100 * pg / wall, 100 * busy / wall / cores,
                                   100 * max(0.0, busy - cpu - pg - wrk_cpu) / wall / cores,
                                   os.getloadavg()[0], samples, events, locks)
                        answered += requests - non_2xx
                        out.append(m)
                        with (folder / "minutes.jsonl").open("a") as f:
                            f.write(json.dumps(asdict(m)) + "\n")
                        print(f"  {code} r{round_no} min {minute}: {m.rate:6.0f}/s p50 {m.p50_ms:6.2f} "
                              f"p90 {m.p90_ms:6.2f} p99 {m.p99_ms:7.2f} max {m.max_ms:7.1f} ms  "
                              f"non-2xx {non_2xx}  CPU server {m.server_cpu_pct:.0f}% pg {m.pg_cpu_pct:.0f}% "
                              f"others {m.others_busy_pct:.0f}%  load {m.load_1min:.1f}  "
                              f"waits {top(events, 5)}", flush=True)
                        for what, n in sorted(locks.items(), key=lambda kv: -kv[1])[:4]:
                            print(f"      {n:4d} × {what}", flush=True)
                finally:
                    sampler.stop()
                took = await drained(dsn, args.drain_timeout)
                checks["drained_s"] = None if took is None else round(took, 1)
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(60):
                    await proc.wait()
                checks["exit"] = proc.returncode
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        stored = await trio.to_thread.run_sync(count, dsn, "select count(*) from events")
        jobs = await trio.to_thread.run_sync(count, dsn, EVENT_JOBS)
        done = await trio.to_thread.run_sync(count, dsn, EVENT_JOBS + " and status = 'done'")
        minutes = [m for m in out if (m.code, m.round) == (code, round_no)]
        # every 202 stored once; a few more stored than answered: requests in flight when a wrk run ended;
        # --duplicates: the warm-up's updates only, each once
        stored_ok = (stored <= args.threads * args.duplicates if args.duplicates
                     else answered <= stored <= answered + args.connections * wrk_runs)
        checks.update(events=stored, jobs=jobs, done=done, answered_202=answered, wrk_runs=wrk_runs,
                      ok=(stored == jobs == done and checks["exit"] == 0 and stored_ok
                          and all(m.non_2xx == 0 and m.socket_errors == 0 for m in minutes)))
        print(f"  {code} r{round_no}: {json.dumps(checks)}", flush=True)
        if checks["ok"] and not args.keep:
            log_path.unlink(missing_ok=True)
        return checks
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{dbname}" with (force)')


def top(counts: dict[str, int], n: int) -> str:
    """The ``n`` largest counts as "name count, ..."."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:n])


def table(minutes: list[Minute]) -> str:
    """The per-minute table (markdown) and the wait events summed per code."""
    lines = ["| code | round | min | answers/s | p50 ms | p90 ms | p99 ms | max ms | non-2xx | server CPU % "
             "| PG CPU % | others % | load | samples | wait events (backend samples) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for m in minutes:
        lines.append(f"| {m.code} | {m.round} | {m.minute} | {m.rate:.0f} | {m.p50_ms:.2f} | {m.p90_ms:.2f} | "
                     f"{m.p99_ms:.2f} | {m.max_ms:.1f} | {m.non_2xx} | {m.server_cpu_pct:.0f} | "
                     f"{m.pg_cpu_pct:.0f} | {m.others_busy_pct:.0f} | {m.load_1min:.1f} | {m.samples} | "
                     f"{top(m.events, 6)} |")
    lines.append("")
    for code in dict.fromkeys(m.code for m in minutes):
        ms = [m for m in minutes if m.code == code]
        events: collections.Counter[str] = collections.Counter()
        locks: collections.Counter[str] = collections.Counter()
        for m in ms:
            events.update(m.events)
            locks.update(m.lock_waits)
        rate = sum(m.requests for m in ms) / sum(m.seconds for m in ms)
        lines.append(f"**{code}**: {rate:.0f} answers/s over {len(ms)} minutes; p50 median "
                     f"{statistics.median(m.p50_ms for m in ms):.2f} ms, p99 median "
                     f"{statistics.median(m.p99_ms for m in ms):.2f} ms, worst {max(m.p99_ms for m in ms):.2f} ms, "
                     f"max {max(m.max_ms for m in ms):.0f} ms; {sum(m.samples for m in ms)} samples: "
                     f"{top(dict(events), 12)}")
        for what, n in locks.most_common(8):
            lines.append(f"- {n} × {what}")
        lines.append("")
    return "\n".join(lines)


async def run(args: argparse.Namespace, folder: Path) -> int:
    minutes: list[Minute] = []
    codes = [("this", ROOT)] + ([("base", args.base_src)] if args.base_src else [])
    all_ok = True
    for round_no in range(1, args.rounds + 1):
        order = codes if round_no % 2 else codes[::-1]
        for code, src in order:
            checks = await one_server(args, code, src, round_no, folder, minutes)
            all_ok &= bool(checks["ok"])
    text = table(minutes)
    (folder / "table.md").write_text(text + "\n")
    print()
    print(text)
    mine = [m for m in minutes if m.code == "this"]
    rate = sum(m.requests for m in mine) / sum(m.seconds for m in mine)
    print(f"output in {folder}")
    print(f"sustained: {rate:.0f} deliveries/s answered ({args.connections} senders, closed loop, "
          f"{len(mine)} minutes), p50 {statistics.median(m.p50_ms for m in mine):.2f} ms, "
          f"worst minute's p99 {max(m.p99_ms for m in mine):.2f} ms{'' if all_ok else '; CHECKS FAILED'}")
    return 0 if all_ok else 1


# --- the open loop (--rate, --search): issue 27's sustained run ----------------------------

#: t0 of an event job's delivery (epoch s): the sender puts it after the command in a
#: message's text, and in the body of the others (bench/openloop.py)
T0 = """case j.kind when 'telegram.message' then split_part(j.payload->>'text', ' ', 2)::float8
                 when 'github.event' then (j.payload->'body'->>'t0')::float8
                 else (j.payload->>'t0')::float8 end"""
#: per window of the offer (its start %(start)s, epoch s; the windows' starts from it %(bounds)s): the events
#: stored, their jobs, and from the delivery's due time to its job's FIRST start p50/p99 in s. Each claim
#: overwrites jobs.claimed_at; an attempt that ended in a retry or a lost lease keeps its start in
#: job_attempts (migrations/0008), so the first start is the least of those and claimed_at. A deferral
#: leaves no attempt row (its claim is given back), so a job deferred or moved back on its line by the
#: send limits (queued_at set, no attempt row: a /ping reply waiting for its chat's slot) is left out of
#: the start's figures: its wait is Telegram's limits', not the server's. Counted in `jobs` all the same.
STORED = f"""
with j as (
    select j.event_id, {T0} as t0,
           extract(epoch from least(j.claimed_at, a.first)) - {T0} as wait,
           j.queued_at is not null and a.first is null as limited
      from jobs j
      left join lateral (select min(x.started_at) as first from job_attempts x where x.job_id = j.id) a on true
     where j.event_id is not null
)
select width_bucket(t0 - %(start)s + 1e-5, %(bounds)s::float8[]) - 1 as w,
       count(distinct event_id) as events, count(*) as jobs,
       percentile_cont(0.5) within group (order by wait) filter (where not limited) as p50,
       percentile_cont(0.99) within group (order by wait) filter (where not limited) as p99,
       max(wait) filter (where not limited) as max
  from j group by 1 order by 1
"""
#: the same start figure per kind and lane (recipient or not) and per window: which jobs wait when the
#: p99 grows (a lane, a kind, the CRM's jobs behind the chats' lines), and how many waited over 1 s
BY_KIND = f"""
with j as (
    select j.kind, j.recipient is not null as lane, {T0} as t0,
           extract(epoch from least(j.claimed_at, a.first)) - {T0} as wait,
           j.queued_at is not null and a.first is null as limited
      from jobs j
      left join lateral (select min(x.started_at) as first from job_attempts x where x.job_id = j.id) a on true
     where j.event_id is not null
)
select kind, lane, width_bucket(t0 - %(start)s + 1e-5, %(bounds)s::float8[]) - 1 as w, count(*) as n,
       percentile_cont(0.5) within group (order by wait) as p50,
       percentile_cont(0.99) within group (order by wait) as p99,
       max(wait) as max, count(*) filter (where wait > 1) as over_1s
  from j where not limited group by 1, 2, 3 order by 1, 2, 3
"""
#: every event stored has exactly one job (the mix makes one per delivery)
ONE_JOB = """select count(*) filter (where n <> 1) from (
    select e.id, (select count(*) from jobs j where j.event_id = e.id) as n from events e) x"""


@dataclass
class OpenMinute:
    """One window of an open-loop run: what was offered, answered, stored, and how the machine fared."""

    label: str
    offered_rate: float
    seconds: float
    due: int = 0
    answered_202: int = 0
    other_answers: int = 0
    no_answer: int = 0
    resent: int = 0
    send_failures: dict[str, int] = field(default_factory=dict)  # what a failed send ran into: count
    stored: int = 0
    jobs: int = 0
    answer_p50_ms: float = 0.0
    answer_p99_ms: float = 0.0
    send_lag_p99_ms: float = 0.0
    start_p50_ms: float = 0.0  # webhook (due) -> job's first claim (STORED)
    start_p99_ms: float = 0.0
    start_max_ms: float = 0.0
    replies: int = 0
    refused_429: int = 0
    crm_calls: int = 0
    rss_mb: float = 0.0
    db_mb: float = 0.0
    server_cpu_pct: float = 0.0
    pg_cpu_pct: float = 0.0
    others_busy_pct: float = 0.0
    load_1min: float = 0.0
    events: dict[str, int] = field(default_factory=dict)
    lock_waits: dict[str, int] = field(default_factory=dict)

    @property
    def server_ms(self) -> float:
        """The server's CPU per delivery due (ms): one process can give 1,000 ms a second."""
        return self.server_cpu_pct * 10 * self.seconds / self.due if self.due else 0.0

    @property
    def ok(self) -> bool:
        """Every delivery answered 202 and stored once, its job started within a second (p99), no 429."""
        return (self.other_answers == 0 and self.no_answer == 0 and self.answered_202 == self.due
                and self.stored == self.answered_202 == self.jobs and self.start_p99_ms <= 1000
                and self.refused_429 == 0)


def rss_mb(pids: list[int]) -> float:
    """The resident memory of these processes together (MB)."""
    total = 0.0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def db_mb(admin_dsn: str, dbname: str) -> float:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return int(conn.execute("select pg_database_size(%s)", (dbname,)).fetchone()[0]) / 2**20  # type: ignore[index]


def stored_windows(dsn: str, start: float, bounds: list[float]) -> dict[int, tuple[int, int, float, float, float]]:
    """Per window index (windows starting ``bounds`` seconds after ``start``, epoch s): events, jobs,
    webhook->start p50, p99, max (s)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(STORED, {"start": start, "bounds": bounds}).fetchall()
    return {r[0]: (r[1], r[2], r[3] or 0.0, r[4] or 0.0, r[5] or 0.0) for r in rows}


def by_kind(dsn: str, start: float, bounds: list[float], labels: list[str]) -> str:
    """BY_KIND as a table: a row per kind and lane, each window's p50 / p99 (ms) and the jobs over 1 s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(BY_KIND, {"start": start, "bounds": bounds}).fetchall()
    cells: dict[tuple[str, bool], dict[int, str]] = {}
    for kind, lane, w, n, p50, p99, _max, over in rows:
        cells.setdefault((kind, lane), {})[w] = f"{1000 * p50:.0f} / {1000 * p99:.0f} ({n}; {over} > 1 s)"
    head = "| kind | recipient | " + " | ".join(labels) + " |"
    lines = [head, "|---|---|" + "---|" * len(labels)]
    for (kind, lane), by_w in sorted(cells.items()):
        lines.append(f"| {kind} | {'yes' if lane else 'no'} | "
                     + " | ".join(by_w.get(k, "") for k in range(len(labels))) + " |")
    return "webhook -> first start by kind, per window: p50 / p99 ms (jobs; jobs over 1 s)\n" + "\n".join(lines)


class Machine:
    """CPU and stub counters between two ``take``s: the servers', PostgreSQL's, the rest of the machine's.

    PostgreSQL's processes are read again at each ``take`` (a backend the pool opens later counts
    from its start), their CPU kept per pid: a window counts what each pid used since the last
    ``take`` (all of it for a new one; the last window of one that exited is lost)."""

    def __init__(self, pids: list[int], admin_dsn: str, dbname: str, stats_url: str) -> None:
        self.pids, self.admin_dsn, self.dbname, self.stats_url = pids, admin_dsn, dbname, stats_url
        self.at = 0.0
        self.cpu = self.busy = self.own = 0.0
        self.pg_cpu: dict[int, float] = {}
        self.stats: dict[str, int] = {}

    async def take(self) -> dict[str, float]:
        from openloop import get_json

        pg_pids = await trio.to_thread.run_sync(postgres_pids, self.admin_dsn, self.dbname)
        now = time.monotonic()
        cpu, busy = postgres_cpu_seconds(self.pids), system_busy_seconds()
        pg_cpu = {pid: postgres_cpu_seconds([pid]) for pid in pg_pids}
        pg = sum(seconds - self.pg_cpu.get(pid, 0.0) for pid, seconds in pg_cpu.items())
        own = sum(os.times()[:2])  # this process (the sender) and its threads
        stats = await get_json(self.stats_url, "/_stats")
        wall = now - self.at
        cores = os.cpu_count() or 1
        out = {"server": 100 * (cpu - self.cpu) / wall, "pg": 100 * pg / wall,
               "others": 100 * max(0.0, (busy - self.busy) - (cpu - self.cpu) - pg - (own - self.own))
               / wall / cores,
               **{k: v - self.stats.get(k, 0) for k, v in stats.items()}} if self.at else {}
        self.at, self.cpu, self.pg_cpu, self.busy, self.own, self.stats = now, cpu, pg_cpu, busy, own, stats
        return out


async def open_server(args: argparse.Namespace, folder: Path, dbname: str, tg_url: str, crm_url: str,
                      log_path: Path, role: str) -> trio.Process:
    """``autom run`` of this checkout with the bench App (sustained_app) on ``dbname``, in ``role``."""
    from openloop import GITHUB_SECRET, STRIPE_SECRET

    dsn = make_conninfo(args.admin_dsn, dbname=dbname)
    env = process_env(dsn, tg_url, WORKERS=str(args.workers), LOG_LEVEL=args.log_level,
                      GITHUB_WEBHOOK_SECRET=GITHUB_SECRET, STRIPE_WEBHOOK_SECRET=STRIPE_SECRET,
                      AUTOM_APP="sustained_app:app", ROLE=role,
                      # every delivery comes from 127.0.0.1: the per-client limit (500/s) would refuse them
                      CLIENT_RATE="1000000")
    env["SUSTAINED_CRM_URL"] = crm_url + "/crm"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{HERE}"
    profile = ["-m", "cProfile", "-o", str(log_path.with_suffix(".prof"))] if args.profile else []
    with log_path.open("wb") as log_file:
        return await trio.lowlevel.open_process(
            [sys.executable, *profile, "-m", "autom", "run"], env=env, cwd=str(folder),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)


async def drained(dsn: str, within: float) -> float | None:
    """Seconds until no job is left unfinished (None: not ``within`` seconds)."""
    t0 = time.monotonic()
    with trio.move_on_after(within):
        while True:  # polling the database: nothing to wait on here
            if not await trio.to_thread.run_sync(count, dsn, BACKLOG):
                return time.monotonic() - t0
            await trio.sleep(0.2)
    return None


async def offer_windows(loop: Any, machine: Machine, sampler: ActivitySampler, rate: float,
                        spans: list[tuple[str, float]], admin_dsn: str, dbname: str, pids: list[int],
                        ) -> list[tuple[OpenMinute, Any]]:
    """Offer ``rate`` for the spans (label, seconds) back to back; each span's window and machine figures."""
    from openloop import Window

    starts, offset = [], 0.0
    for _, seconds in spans:
        starts.append(offset)
        offset += seconds
    windows = [(start, Window()) for start in starts]
    rows = [OpenMinute(label, rate, seconds) for label, seconds in spans]
    async with trio.open_nursery() as nursery:
        begun = trio.current_time()

        async def sample() -> None:
            await machine.take()
            sampler.take()
            for start, row in zip(starts, rows, strict=True):
                await trio.sleep_until(begun + start + row.seconds)
                m = await machine.take()
                _, events, locks = sampler.take()
                row.server_cpu_pct, row.pg_cpu_pct, row.others_busy_pct = m["server"], m["pg"], m["others"]
                row.replies, row.refused_429, row.crm_calls = int(m["sent"]), int(m["refused"]), int(m["crm"])
                row.rss_mb, row.db_mb = rss_mb(pids), await trio.to_thread.run_sync(db_mb, admin_dsn, dbname)
                row.load_1min, row.events, row.lock_waits = os.getloadavg()[0], events, locks

        nursery.start_soon(sample)
        await loop.offer(rate, offset, windows)
    return [(row, w) for row, (_, w) in zip(rows, windows, strict=True)]


def fill(row: OpenMinute, window: Any, stored: tuple[int, int, float, float, float] | None) -> OpenMinute:
    """The sender's and the database's figures of one window into its row."""
    from openloop import percentile

    row.due, row.answered_202 = window.due, window.accepted
    row.other_answers = sum(n for status, n in window.answered.items() if status != 202)
    row.no_answer, row.resent, row.send_failures = window.errors, window.resent, dict(window.why)
    row.answer_p50_ms = 1000 * percentile(window.latencies, 50)
    row.answer_p99_ms = 1000 * percentile(window.latencies, 99)
    row.send_lag_p99_ms = 1000 * percentile(window.lag, 99)
    if stored is not None:
        row.stored, row.jobs = stored[0], stored[1]
        row.start_p50_ms, row.start_p99_ms, row.start_max_ms = (1000 * x for x in stored[2:])
    return row


def open_table(rows: list[OpenMinute]) -> str:
    lines = ["| window | offered/s | due | 202 | stored | jobs | other/none | answer p50 / p99 ms | send lag p99 ms "
             "| webhook→start p50 / p99 / max ms | replies | 429s | CRM calls | RSS MB | DB MB | server CPU % "
             "| server ms/delivery | PG CPU % | others % | load | ok |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.label} | {r.offered_rate:.0f} | {r.due} | {r.answered_202} | {r.stored} | {r.jobs} | "
                     f"{r.other_answers}/{r.no_answer} | {r.answer_p50_ms:.1f} / {r.answer_p99_ms:.1f} | "
                     f"{r.send_lag_p99_ms:.1f} | {r.start_p50_ms:.1f} / {r.start_p99_ms:.1f} / {r.start_max_ms:.0f} | "
                     f"{r.replies} | {r.refused_429} | {r.crm_calls} | {r.rss_mb:.0f} | {r.db_mb:.0f} | "
                     f"{r.server_cpu_pct:.0f} | {r.server_ms:.2f} | {r.pg_cpu_pct:.0f} | {r.others_busy_pct:.0f} | "
                     f"{r.load_1min:.1f} | "
                     f"{'yes' if r.ok else 'NO'} |")
    return "\n".join(lines)


async def run_open(args: argparse.Namespace, folder: Path) -> int:
    """``--rate`` (minutes at one offered rate) or ``--search`` (the highest rate that holds)."""
    from openloop import Deliveries, OpenLoop

    dbname = f"autom_sustained_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{dbname}"')
    dsn = make_conninfo(args.admin_dsn, dbname=dbname)
    rows: list[OpenMinute] = []
    stubs = await trio.lowlevel.open_process([sys.executable, str(HERE / "openloop.py"), "stubs"],
                                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    procs: list[trio.Process] = []
    try:
        assert stubs.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await stubs.stdout.receive_some(4096)
                if not chunk:
                    break
                line += chunk
        ready = line.decode().split()
        if not ready or ready[0] != "READY":
            raise RuntimeError(f"the stubs did not start: {ready}")
        tg_url, crm_url = ready[1], ready[2]
        # --split: the deliveries go to --intakes ROLE=intake processes, a ROLE=worker one runs the jobs
        urls = []
        roles = ([("intake", k) for k in range(1, args.intakes + 1)]
                 + [("worker", k) for k in range(1, args.worker_procs + 1)] if args.split else [("all", 1)])
        for role, k in roles:
            log_path = folder / f"open.{role}-{k}.log"
            procs.append(await open_server(args, folder, dbname, tg_url, crm_url, log_path, role))
            urls.append(await wait_serving(procs[-1], log_path))
            print(f"autom run ROLE={role} pid {procs[-1].pid} at {urls[-1]} (AUTOM_APP=sustained_app:app)",
                  flush=True)
        print(f"stubs: Telegram {tg_url}, CRM {crm_url}", flush=True)
        pids = [p.pid for p in procs]
        targets = [(h, int(p)) for h, p in (u.removeprefix("http://").rsplit(":", 1)
                                           for u in (urls[:args.intakes] if args.split else urls))]
        host, port = targets[0]
        loop = OpenLoop(targets, Deliveries(f"{host}:{port}", TG_SECRET, SITE_SECRET, args.chats, args.seed),
                        args.max_connections)
        machine = Machine(pids, args.admin_dsn, dbname, crm_url)
        sampler = ActivitySampler(args.admin_dsn, dbname)
        sampler.start()
        try:
            failed = math.inf
            if args.search:
                rate, passed = args.rate or args.search_from, 0.0
                steps = 0
                while steps < args.search_steps:
                    steps += 1
                    label = f"step {steps}"
                    [(row, window)] = await offer_windows(loop, machine, sampler, rate, [(label, args.step_seconds)],
                                                          args.admin_dsn, dbname, pids)
                    took = await drained(dsn, args.drain_timeout)
                    stored = await trio.to_thread.run_sync(stored_windows, dsn, loop.wall_start, [0.0])
                    rows.append(fill(row, window, stored.get(0)))
                    ok = row.ok and took is not None
                    print(open_line(row, took), flush=True)
                    if ok:
                        passed = max(passed, rate)
                    else:
                        failed = min(failed, rate)
                    if failed == math.inf:
                        rate = rate * args.search_factor
                    elif failed - passed <= max(10.0, 0.05 * failed):
                        break
                    else:
                        rate = (passed + failed) / 2 if passed else failed / 2
                    if took is None:  # a backlog left: the next step would inherit it
                        break
                sustained = passed
            else:
                spans = [("warm-up", args.warmup)] + [(f"min {m}", args.minute_seconds)
                                                     for m in range(1, args.minutes + 1)]
                pairs = await offer_windows(loop, machine, sampler, args.rate, spans, args.admin_dsn, dbname,
                                            pids)
                took = await drained(dsn, args.drain_timeout)
                bounds = list(itertools.accumulate([0.0] + [s for _, s in spans[:-1]]))
                stored = await trio.to_thread.run_sync(stored_windows, dsn, loop.wall_start, bounds)
                for k, (row, window) in enumerate(pairs):
                    rows.append(fill(row, window, stored.get(k)))
                    print(open_line(row, took if k == len(pairs) - 1 else 0.0), flush=True)
                measured = rows[1:]
                sustained = args.rate if took is not None and all(r.ok for r in measured) else 0.0
        finally:
            sampler.stop()
            await loop.aclose()
        bounds = [0.0] if args.search else list(itertools.accumulate([0.0] + [r.seconds for r in rows[:-1]]))
        labels = ["last step"] if args.search else [r.label for r in rows]
        kinds = await trio.to_thread.run_sync(by_kind, dsn, loop.wall_start, bounds, labels)
        events = await trio.to_thread.run_sync(count, dsn, "select count(*) from events")
        answered = sum(r.answered_202 for r in rows)
        not_one = await trio.to_thread.run_sync(count, dsn, ONE_JOB)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(60):
            for proc in procs:
                await proc.wait()
        exits = [proc.returncode for proc in procs]
        once = events == answered and not_one == 0
        text = open_table(rows)
        (folder / "table.md").write_text(text + "\n\n" + kinds + "\n")
        with (folder / "windows.jsonl").open("w") as f:
            for r in rows:
                f.write(json.dumps(asdict(r)) + "\n")
        print()
        print(text)
        print()
        print(kinds)
        print()
        print(f"exactly once: {events} events for {answered} answers 202, events without exactly one job: "
              f"{not_one}; server exit {exits}; output in {folder}")
        ok = once and exits == [0] * len(procs)
        mode = (f"rate search, {args.step_seconds:g} s steps" if args.search
                else f"{args.minutes} x {args.minute_seconds:g} s at {args.rate:g}/s offered")
        mode = ("intake and worker processes, " if args.split else "") + mode
        bound = "; no step failed: a lower bound" if args.search and sustained and failed == math.inf else ""
        print(f"sustained: {sustained:.0f} deliveries/s ({mode}; mixed sources, open loop{bound})"
              f"{'' if ok else '; CHECKS FAILED'}")
        return 0 if ok and sustained > 0 else 1
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stubs.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await stubs.wait()
        if stubs.returncode is None:
            stubs.kill()
        with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{dbname}" with (force)')


def open_line(r: OpenMinute, drained_s: float | None) -> str:
    return (f"  {r.label}: offered {r.offered_rate:.0f}/s, {r.answered_202}/{r.due} answered 202, stored "
            f"{r.stored} (jobs {r.jobs}), answer p50 {r.answer_p50_ms:.1f} p99 {r.answer_p99_ms:.1f} ms, "
            f"webhook->start p50 {r.start_p50_ms:.1f} p99 {r.start_p99_ms:.1f} ms, replies {r.replies}, "
            f"429s {r.refused_429}, RSS {r.rss_mb:.0f} MB, DB {r.db_mb:.0f} MB, CPU server "
            f"{r.server_cpu_pct:.0f}% ({r.server_ms:.2f} ms a delivery) pg {r.pg_cpu_pct:.0f}% "
            f"others {r.others_busy_pct:.0f}%"
            + ("" if drained_s is None else f", drained in {drained_s:.1f} s" if drained_s else "")
            + ("" if r.ok else "  [FAILS]")
            + (f"  resent {r.resent}, failed sends {top(r.send_failures, 3)}" if r.send_failures else "")
            + (f"  locks {top(r.lock_waits, 2)}" if r.lock_waits else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=int, default=10, help="minutes of load per server (one wrk run each)")
    parser.add_argument("--minute-seconds", type=float, default=60.0, help="length of a 'minute' (wrk's -d)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first minute")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--chats", type=int, default=10_000)
    parser.add_argument("--duplicates", type=int, default=0, metavar="K",
                        help="closed loop: the warm-up stores K updates per wrk thread, every minute sends "
                             "only those again (issue 26's duplicate-only run)")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--log-level", default="info", help="the server's LOG_LEVEL (its log goes to a file)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (each runs every code once, alternating)")
    parser.add_argument("--base-src", type=Path, default=None, help="a checkout of other code to run beside")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--admin-dsn", default=os.environ.get("AUTOM_BENCH_ADMIN_DSN", DEFAULT_ADMIN_DSN))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the servers' logs")
    parser.add_argument("--rate", type=float, default=None,
                        help="open loop: offer this many mixed deliveries a second (issue 27's run), --minutes long")
    parser.add_argument("--search", action="store_true",
                        help="open loop: find the highest offered rate that holds (steps of --step-seconds)")
    parser.add_argument("--search-from", type=float, default=100.0, help="--search: the first step's rate")
    parser.add_argument("--search-factor", type=float, default=1.25, help="--search: each step's rate over the last's")
    parser.add_argument("--search-steps", type=int, default=12, help="--search: most steps")
    parser.add_argument("--step-seconds", type=float, default=30.0, help="--search: seconds per step")
    parser.add_argument("--max-connections", type=int, default=512, help="open loop: most connections at once")
    parser.add_argument("--seed", type=int, default=1, help="open loop: the mix's random seed")
    parser.add_argument("--profile", action="store_true",
                        help="open loop: run the server(s) under cProfile (open.ROLE-N.prof in --out; pstats reads it)")
    parser.add_argument("--split", action="store_true",
                        help="open loop: two processes, ROLE=intake (the deliveries) and ROLE=worker (the jobs)")
    parser.add_argument("--worker-procs", type=int, default=1,
                        help="--split: this many ROLE=worker processes (each with --workers runners)")
    parser.add_argument("--intakes", type=int, default=1,
                        help="--split: this many ROLE=intake processes, the deliveries spread over them in turn "
                             "(as a load balancer in front of replicas would)")
    args = parser.parse_args(argv)
    open_loop = args.rate is not None or args.search
    if not open_loop and shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 1
    if args.base_src:
        args.base_src = base_checkout(args.base_src)
    folder = args.out or Path(tempfile.gettempdir()) / f"autom-sustained-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    return trio.run(run_open if open_loop else run, args, folder)


if __name__ == "__main__":
    sys.exit(main())
