"""A sustained closed loop against ``autom run``: the sender's answer minute by minute, and what waits.

    .venv/bin/python bench/sustained.py [--minutes 10] [--connections 16] [--chats 10000] [--workers 16]
                                        [--base-src DIR] [--rounds 1] [--out DIR] [--admin-dsn DSN]

What a run does (issue 26's probe, for as long as asked):

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL) and starts
   one real ``autom run`` on it (WORKERS=``--workers``, LOG_LEVEL info to a file, the
   Telegram stub of tests/support in this process as its Bot API; ``autom run`` applies
   the migrations);
2. ``wrk`` (``--threads`` threads, ``--connections`` connections, a closed loop: each
   connection sends its next request when the answer to the last one came) posts signed
   Telegram ``message`` updates from ``--chats`` chats picked at random, ``"text":"hello"``
   (no reply is asked: the job runs and is done), each with a new ``update_id``; one wrk
   run per minute, back to back, so each minute has its own percentiles;
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
one run. Its migrations must be this checkout's (the editable install gives ``autom
run`` this checkout's ``autom.migrations`` whatever PYTHONPATH says). The machine is
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
import json
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
from intake import cpu_seconds, postgres_cpu_seconds, postgres_pids, system_busy_seconds  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402

from tests.support.processes import process_env  # noqa: E402
from tests.support.service import TG_SECRET  # noqa: E402
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
-- args: secret, nonce (update ids unique per wrk run), chats
local counter = 0
local token, nonce, chats
local nthreads = 0

function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end

function init(args)
  token = args[1]
  nonce = tonumber(args[2])
  chats = tonumber(args[3])
  math.randomseed(nonce % 1000003 + tid * 7919)
end

function request()
  counter = counter + 1
  local uid = nonce + tid * 100000000 + counter
  local chat = CHAT_BASE + math.random(0, chats - 1)
  local body = string.format(
    '{"update_id":%d,"message":{"message_id":%d,"date":1700000000,' ..
    '"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,"first_name":"Sustained"},' ..
    '"text":"hello"}}', uid, counter, chat, chat)
  return wrk.format("POST", "/hooks/telegram",
    {["Content-Type"] = "application/json", ["X-Telegram-Bot-Api-Secret-Token"] = token}, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d %d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
""".replace("CHAT_BASE", str(CHAT_BASE))

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


def run_wrk(url: str, script: Path, args: argparse.Namespace, nonce: int, seconds: float) -> tuple[int, ...]:
    """One wrk run; its RESULT numbers (requests, µs, non-2xx, socket errors, p50, p90, p99, max µs)."""
    cmd = ["wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{seconds:g}s", "--timeout", "10s",
           "-s", str(script), url, "--", TG_SECRET, str(nonce), str(args.chats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result:\n{out}")
    return tuple(int(x) for x in line.split()[1:])


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
                url = ""
                with trio.fail_after(60):
                    while not url:
                        if proc.returncode is not None:
                            raise RuntimeError(f"autom run exited: {log_path.read_text()[-3000:]}")
                        found = SERVING.search(log_path.read_text(errors="replace"))
                        url = found.group(1) if found else ""
                        await trio.sleep(0.1)
                print(f"{code} round {round_no}: autom run pid {proc.pid} at {url} (PYTHONPATH={src})", flush=True)
                # warm-up: imports, pool, plans (its 202s count in the checks, not in the minutes)
                warm = await trio.to_thread.run_sync(run_wrk, url, script, args, (round_no * 100 + 99) * 10**9,
                                                     args.warmup)
                answered = warm[0] - warm[2]
                wrk_runs = 1
                pg_pids = postgres_pids(args.admin_dsn, dbname)
                sampler = ActivitySampler(args.admin_dsn, dbname)
                sampler.start()
                sampler.take()
                try:
                    for minute in range(1, args.minutes + 1):
                        nonce = (round_no * 100 + minute) * 10**9
                        cpu0, pg0, busy0 = cpu_seconds(proc.pid), postgres_cpu_seconds(pg_pids), system_busy_seconds()
                        kids0 = os.times()
                        t0 = time.monotonic()
                        res = await trio.to_thread.run_sync(run_wrk, url, script, args, nonce, args.minute_seconds)
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
                drained_at = time.monotonic()
                with trio.move_on_after(args.drain_timeout):
                    while True:  # polling the database: nothing to wait on here
                        if not await trio.to_thread.run_sync(count, dsn, BACKLOG):
                            break
                        await trio.sleep(0.2)
                checks["drained_s"] = round(time.monotonic() - drained_at, 1)
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
        # every 202 stored once; a few more stored than answered: requests in flight when a wrk run ended
        checks.update(events=stored, jobs=jobs, done=done, answered_202=answered, wrk_runs=wrk_runs,
                      ok=(stored == jobs == done and checks["exit"] == 0
                          and answered <= stored <= answered + args.connections * wrk_runs
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


def same_migrations(a: Path, b: Path) -> bool:
    """Whether two migrations folders hold the same files with the same text."""
    def texts(folder: Path) -> dict[str, str]:
        return {p.name: p.read_text() for p in folder.glob("*.sql")}

    return texts(a) == texts(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=int, default=10, help="minutes of load per server (one wrk run each)")
    parser.add_argument("--minute-seconds", type=float, default=60.0, help="length of a 'minute' (wrk's -d)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first minute")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--chats", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--log-level", default="info", help="the server's LOG_LEVEL (its log goes to a file)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (each runs every code once, alternating)")
    parser.add_argument("--base-src", type=Path, default=None, help="a checkout of other code to run beside")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--admin-dsn", default=os.environ.get("AUTOM_BENCH_ADMIN_DSN", DEFAULT_ADMIN_DSN))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the servers' logs")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 1
    if args.base_src and not same_migrations(ROOT / "migrations", args.base_src / "migrations"):
        # the editable install maps autom.migrations to this checkout's folder whatever PYTHONPATH says
        print("--base-src: its migrations differ from this checkout's, and autom run would apply this "
              "checkout's to it (autom.migrations comes from the editable install)", file=sys.stderr)
        return 1
    folder = args.out or Path(tempfile.gettempdir()) / f"autom-sustained-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    return trio.run(run, args, folder)


if __name__ == "__main__":
    sys.exit(main())
