"""Load without loss: a burst far faster than the workers drain it; RSS, intake p99, and a full drain.

    python bench/load.py [--events 30000] [--chats 1000] [--connections 32] [--rounds 2]
                         [--workers 8] [--settle 20] [--admin-dsn DSN] [--json FILE] [--keep]

What one run does:

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL 15
   on 127.0.0.1:5432), applies the migrations (dropped at the end);
2. serves the Telegram stub (``tests/support/telegram_stub.py``) in this process:
   every call answered at once with 200;
3. starts one real ``autom run`` (``tests/support/processes.py``: JSON logs at
   info to a file, WORKERS=``--workers``, default lease and timeouts);
4. samples the process's RSS (psutil) and the backlog (jobs due or running) every
   second, from before the first burst to the end;
5. per round: ``wrk`` (one thread, ``--connections`` connections; ``apt-get
   install wrk``) posts ``--events`` signed ``/ping`` updates, each a new update
   over ``--chats`` chats (so 30 a chat by default), and stops after that many
   answers (the few requests already on the wire then are redeliveries of the
   first updates: answered "duplicate", nothing stored). wrk's latency
   percentiles are the intake's during the burst. Then it waits for the backlog
   to drain and for ``--settle`` seconds more;
6. checks there was no loss and no double run: every answer 202, one event and
   one ``done`` job per update, none failed, and the stub got exactly one
   ``pong`` per update (``--events / --chats`` per chat per round);
7. prints a table per round and the RSS series, and exits 1 if a check failed.

wrk, not a Python client: on two cores a Python load generator takes the CPU the
server needs, and the numbers would be the generator's. wrk spends a few per
cent of one core at these rates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import trio
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import AutomProcess, autom_processes
from tests.support.service import TG_SECRET
from tests.support.telegram_stub import TelegramStub, running_stub

CHAT_BASE = 9_000_000
#: wrk's own limit; it stops itself after --events answers long before
WRK_SECONDS = int(os.environ.get("AUTOM_LOAD_WRK_SECONDS", "600"))
DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

LUA = r"""
counter = 0
responses = 0
bad = 0

function init(args)
  token = args[1]
  nonce = tonumber(args[2])
  total = tonumber(args[3])
  chats = tonumber(args[4])
  chat_base = tonumber(args[5])
end

function request()
  counter = counter + 1
  local n = counter
  -- past the total (requests already on the wire when the last answer arrives): redeliveries
  if n > total then n = ((n - 1) % total) + 1 end
  local uid = nonce + n
  local chat = chat_base + (n % chats)
  local body = string.format(
    '{"update_id":%d,"message":{"message_id":%d,"date":1700000000,' ..
    '"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,"first_name":"Load"},' ..
    '"text":"/ping"}}', uid, n, chat, chat)
  return wrk.format("POST", "/hooks/telegram",
    {["Content-Type"] = "application/json", ["X-Telegram-Bot-Api-Secret-Token"] = token}, body)
end

function response(status, headers, body)
  responses = responses + 1
  if status ~= 202 then bad = bad + 1 end
  if responses >= total then wrk.thread:stop() end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d %d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


@dataclass
class Round:
    number: int
    requests: int = 0
    extra_requests: int = 0
    seconds: float = 0.0
    non_2xx: int = 0
    socket_errors: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    p999_ms: float = 0.0
    max_ms: float = 0.0
    burst_started: float = 0.0
    burst_ended: float = 0.0
    backlog_at_burst_end: int = 0
    backlog_peak: int = 0
    drained_after_s: float = math.nan
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_drained_mb: float = 0.0
    rss_settled_mb: float = 0.0
    cpu_burst_pct: float = 0.0
    cpu_drain_pct: float = 0.0
    loadavg_1m: float = 0.0
    stall: list[dict[str, Any]] = field(default_factory=list)
    stall_sessions: list[dict[str, Any]] = field(default_factory=list)
    #: the longest time the backlog stood still after the burst (s), and its level then
    stall_s: float = 0.0
    stall_backlog: int = 0
    #: the longest time between two job completions (finished_at) after the burst, and when
    #: it ended (s after the burst); a stall shorter than the sampler's 1 s shows here too
    longest_gap_s: float = 0.0
    longest_gap_ended_s: float = 0.0


@dataclass
class Sampler:
    """RSS and backlog once a second."""

    pid: int
    dsn: str
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (time, rss MB, backlog)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (time, % of one core)

    async def run(self) -> None:
        proc = psutil.Process(self.pid)
        proc.cpu_percent()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                try:
                    rss = proc.memory_info().rss / 2**20
                except psutil.NoSuchProcess:
                    return  # it died: the run notices (alive()) and says why
                backlog = await trio.to_thread.run_sync(_backlog, conn)
                now = time.time()
                self.samples.append((now, rss, backlog))
                self.cpu.append((now, proc.cpu_percent()))
                await trio.sleep(1.0)

    def cpu_between(self, start: float, end: float) -> float:
        values = [c for t, c in self.cpu if start <= t <= end]
        return sum(values) / len(values) if values else math.nan

    def between(self, start: float, end: float) -> list[tuple[float, float, int]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def last(self) -> tuple[float, float, int]:
        return self.samples[-1]


def _backlog(conn: psycopg.Connection[Any]) -> int:
    # due_at is NULL once a job finished: pending (due or not) and running jobs
    return int(conn.execute("select count(*) from jobs where due_at is not null").fetchone()[0])  # type: ignore[index]


async def run_wrk(url: str, dsn: str, script: Path, round_: Round, events: int, chats: int,
                  connections: int) -> None:
    """Post ``events`` new updates with wrk; the burst ends when the last of them is stored.

    The Lua script stops sending after ``events`` answers (``wrk.thread:stop()``), but
    wrk's main thread sleeps out its ``-d`` anyway; a SIGINT ends it at once and makes
    it print its statistics, as Ctrl-C does.
    """
    nonce = round_.number * 1_000_000_000
    command = ["wrk", "-t1", f"-c{connections}", f"-d{WRK_SECONDS}s", "--timeout", "10s", "-s", str(script), url,
               "--", TG_SECRET, str(nonce), str(events), str(chats), str(CHAT_BASE)]
    out_path = script.with_suffix(f".{round_.number}.out")
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = _events(conn)
        round_.burst_started = time.time()
        with out_path.open("wb") as out_file:  # a local file: opening it does not block
            wrk = await trio.lowlevel.open_process(command, stdout=out_file, stderr=subprocess.STDOUT)
        try:
            while wrk.returncode is None:
                if await trio.to_thread.run_sync(_events, conn) >= before + events:
                    break
                await trio.sleep(0.1)
            round_.burst_ended = time.time()
            await trio.sleep(0.3)
            wrk.send_signal(signal.SIGINT)
            with trio.fail_after(30):
                await wrk.wait()
        finally:
            if wrk.returncode is None:
                wrk.kill()
                await wrk.wait()
    out = out_path.read_text()
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result ({wrk.returncode}):\n{out}")
    requests, _duration_us, status_errors, socket_errors, p50, p99, p999, worst = map(int, line.split()[1:])
    round_.requests = events
    round_.extra_requests = requests - events
    round_.seconds = round_.burst_ended - round_.burst_started
    round_.non_2xx, round_.socket_errors = status_errors, socket_errors
    round_.p50_ms, round_.p99_ms, round_.p999_ms, round_.max_ms = p50 / 1e3, p99 / 1e3, p999 / 1e3, worst / 1e3


#: the jobs still due or running, with their recipient's row (for a backlog that stopped moving)
STALLED_JOBS = (
    "select j.id, j.status, j.attempts, autom_lease_generation(j.lease) as lease, now() - j.run_at as waited,"
    " j.locked_until - now() as lease_left, j.recipient, r.busy_until - now() as busy_left,"
    " r.next_due_at - now() as next_due_in, r.last_served,"
    " j.last_error from jobs j left join recipients r using (recipient)"
    " where j.due_at is not null order by j.id limit 20")
#: what the database's other sessions are doing (a claim waiting on a lock, a transaction left open)
SESSIONS = (
    "select pid, state, wait_event_type, wait_event, now() - xact_start as in_xact,"
    " now() - state_change as in_state, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) as query"
    " from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"
    " order by xact_start nulls last")


def snapshot(dsn: str, query: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return list(conn.execute(query))


def _events(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("select count(*) from events").fetchone()[0])  # type: ignore[index]


async def load(args: argparse.Namespace, dsn: str, folder: Path) -> dict[str, Any]:
    script = folder / "load.lua"
    script.write_text(LUA)
    rounds: list[Round] = []
    async with running_stub() as stub, autom_processes(folder) as procs:
        proc: AutomProcess = await procs.start(
            dsn=dsn, telegram_url=stub.url, WORKERS=str(args.workers), LOG_LEVEL="info",
            JOB_LEASE_SECONDS="60", HTTP_TIMEOUT_SECONDS="10", SHUTDOWN_GRACE_SECONDS="20",
            RETRY_BASE_SECONDS="1", RETRY_MAX_SECONDS="10",
        )
        print(f"autom run pid {proc.pid} at {proc.url}; stub at {stub.url}", flush=True)
        sampler = Sampler(proc.pid, dsn)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run)
            await trio.sleep(args.settle)  # idle baseline: start-up done, ticker ran
            for number in range(1, args.rounds + 1):
                round_ = Round(number)
                round_.rss_before_mb = sampler.last()[1]
                print(f"round {number}: burst of {args.events} updates over {args.chats} chats, "
                      f"{args.connections} connections", flush=True)
                await run_wrk(proc.url, dsn, script, round_, args.events, args.chats, args.connections)
                alive(proc)
                await trio.sleep(1.1)  # one more sample after the burst
                round_.backlog_at_burst_end = next(b for t, _, b in sampler.samples if t >= round_.burst_ended)
                print(f"  burst done in {round_.seconds:.1f}s ({round_.requests / round_.seconds:.0f} req/s), "
                      f"p99 {round_.p99_ms:.1f} ms; backlog {round_.backlog_at_burst_end}", flush=True)
                with trio.fail_after(args.drain_timeout):
                    while True:
                        alive(proc)
                        at, _, backlog = sampler.last()
                        if backlog == 0 and at > round_.burst_ended:
                            break
                        recent = [b for t, _, b in sampler.samples[-4:] if t > round_.burst_ended]
                        if len(recent) == 4 and len(set(recent)) == 1 and not round_.stall:
                            # the backlog has not moved for 3 s: note what is waiting, and why
                            round_.stall = await trio.to_thread.run_sync(snapshot, dsn, STALLED_JOBS)
                            round_.stall_sessions = await trio.to_thread.run_sync(snapshot, dsn, SESSIONS)
                            print(f"  backlog stuck at {backlog} at {time.strftime('%H:%M:%S')}: "
                                  f"{json.dumps(round_.stall, default=str)[:3000]}\n  sessions: "
                                  f"{json.dumps(round_.stall_sessions, default=str)[:3000]}", flush=True)
                        await trio.sleep(0.2)
                drained = sampler.last()[0]
                round_.drained_after_s = drained - round_.burst_ended
                round_.stall_s, round_.stall_backlog = longest_still(sampler.between(round_.burst_ended, drained))
                if round_.stall_s >= 3.0:
                    print(f"  the backlog stood still {round_.stall_s:.0f}s at {round_.stall_backlog}", flush=True)
                round_.rss_drained_mb = sampler.last()[1]
                print(f"  backlog drained {round_.drained_after_s:.1f}s after the burst", flush=True)
                await trio.sleep(args.settle)
                during = sampler.between(round_.burst_started, drained)
                round_.backlog_peak = max(s[2] for s in during)
                round_.rss_peak_mb = max(s[1] for s in during)
                round_.rss_settled_mb = sampler.last()[1]
                round_.cpu_burst_pct = sampler.cpu_between(round_.burst_started, round_.burst_ended)
                round_.cpu_drain_pct = sampler.cpu_between(round_.burst_ended, drained)
                round_.loadavg_1m = os.getloadavg()[0]
                rounds.append(round_)
            nursery.cancel_scope.cancel()
        proc.terminate()
        exit_code = await proc.wait(timeout=30)
        calls = stub_calls(stub)
    await trio.to_thread.run_sync(completion_gaps, dsn, rounds)
    checks = verify(dsn, rounds, args, calls, exit_code)
    return {
        "rounds": [r.__dict__ for r in rounds],
        "checks": checks,
        "rss_series": [(round(t - sampler.samples[0][0], 1), round(rss, 1), backlog)
                       for t, rss, backlog in sampler.samples],
        "exit_code": exit_code,
    }


def longest_still(samples: list[tuple[float, float, int]]) -> tuple[float, int]:
    """The longest stretch (s) in which the backlog did not change, and its level then (0 excluded)."""
    best, level, start = 0.0, 0, None
    for i, (t, _, backlog) in enumerate(samples):
        if i == 0 or backlog != samples[i - 1][2]:
            start = t
        if backlog and start is not None and t - start > best:
            best, level = t - start, backlog
    return best, level


def alive(proc: AutomProcess) -> None:
    """Raise with the end of its log if ``autom run`` exited (it must not, under any load)."""
    if proc.returncode is not None:
        tail = "\n".join(proc.log_text().splitlines()[-60:])
        raise RuntimeError(f"autom run exited with {proc.returncode} during the run; its log ends:\n{tail}")


def stub_calls(stub: TelegramStub) -> dict[str, int]:
    counts: dict[str, int] = {}
    for call in stub.calls_of("sendMessage"):
        chat = str(call.params.get("chat_id"))
        counts[chat] = counts.get(chat, 0) + 1
    return counts


def completion_gaps(dsn: str, rounds: list[Round]) -> None:
    """Per round: the longest pause between two completions from the burst's end to the last job."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for r in rounds:
            row = conn.execute(
                "select extract(epoch from gap)::float8, extract(epoch from at)::float8 from ("
                " select finished_at - lag(finished_at) over (order by finished_at) as gap, finished_at as at"
                " from jobs where finished_at >= to_timestamp(%s) and finished_at <= to_timestamp(%s)) g"
                " where gap is not null order by gap desc limit 1",
                (r.burst_ended, r.burst_ended + r.drained_after_s + 1.0)).fetchone()
            if row is not None:
                r.longest_gap_s, r.longest_gap_ended_s = row[0], row[1] - r.burst_ended


def verify(dsn: str, rounds: list[Round], args: argparse.Namespace, calls: dict[str, int],
           exit_code: int) -> list[tuple[str, bool, str]]:
    total = args.events * len(rounds)
    with psycopg.connect(dsn, autocommit=True) as conn:
        events = conn.execute("select count(*) from events").fetchone()[0]  # type: ignore[index]
        by_status = dict(conn.execute(
            "select status, count(*) from jobs where kind = 'telegram.message' group by status").fetchall())
        per_chat_jobs = conn.execute(
            "select min(n), max(n) from (select recipient, count(*) n from jobs"
            " where kind = 'telegram.message' group by recipient) x").fetchone()
    per_round = args.events // args.chats
    chat_calls = [n for chat, n in calls.items() if chat.isdigit() and int(chat) >= CHAT_BASE]
    return [
        ("every request answered 202", all(r.non_2xx == 0 and r.socket_errors == 0 for r in rounds),
         ", ".join(f"round {r.number}: {r.requests} requests, non-2xx {r.non_2xx}, socket errors {r.socket_errors}"
                   for r in rounds)),
        ("one event per update", events == total, f"{events} events for {total} updates"),
        ("every job done, none failed or left",
         by_status.get("done", 0) == total and set(by_status) == {"done"}, f"jobs by status {by_status}"),
        ("per chat: one job per update", tuple(per_chat_jobs) == (per_round * len(rounds),) * 2,
         f"jobs per chat min/max {tuple(per_chat_jobs)}"),
        ("exactly one pong per update (no loss, no double run)",
         sum(chat_calls) == total and len(chat_calls) == args.chats
         and min(chat_calls) == max(chat_calls) == per_round * len(rounds),
         f"{sum(chat_calls)} sendMessage calls over {len(chat_calls)} chats"),
        ("SIGTERM after the run exits 0", exit_code == 0, f"exit {exit_code}"),
    ]


def print_report(result: dict[str, Any]) -> bool:
    rows = result["rounds"]
    print("\n| round | updates | burst s | req/s | p50 ms | p99 ms | p99.9 ms | max ms | backlog at end | "
          "drained after s | drain jobs/s | RSS before / peak / drained / settled MB | CPU burst / drain % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        drain_rate = r["backlog_at_burst_end"] / r["drained_after_s"] if r["drained_after_s"] else math.nan
        print(f"| {r['number']} | {r['requests']} | {r['seconds']:.1f} | {r['requests'] / r['seconds']:.0f} | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['p999_ms']:.1f} | {r['max_ms']:.1f} | "
              f"{r['backlog_at_burst_end']} | {r['drained_after_s']:.1f} | {drain_rate:.0f} | "
              f"{r['rss_before_mb']:.1f} / {r['rss_peak_mb']:.1f} / {r['rss_drained_mb']:.1f} / "
              f"{r['rss_settled_mb']:.1f} | {r['cpu_burst_pct']:.0f} / {r['cpu_drain_pct']:.0f} |")
    print("load average (1 min) at the end of each round: "
          + ", ".join(f"{r['loadavg_1m']:.2f}" for r in rows) + f" on {os.cpu_count()} cores")
    print("longest time the backlog stood still during a drain: "
          + ", ".join(f"round {r['number']}: {r['stall_s']:.0f}s at {r['stall_backlog']}" for r in rows))
    print("longest pause between two completions after the burst: "
          + ", ".join(f"round {r['number']}: {r['longest_gap_s'] * 1000:.0f} ms "
                      f"(ending {r['longest_gap_ended_s']:.1f}s after the burst)" for r in rows))
    print("\nRSS (MB) and backlog every 5 s: " + "  ".join(
        f"{t:.0f}s {rss:.0f}MB/{backlog}" for t, rss, backlog in result["rss_series"][::5]))
    print()
    ok = True
    for name, passed, detail in result["checks"]:
        ok &= passed
        print(f"  {'PASS' if passed else 'FAIL'}  {name}: {detail}")
    print(f"\nload {'PASSED' if ok else 'FAILED'}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--chats", type=int, default=1_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--settle", type=float, default=20.0, help="idle seconds before and after each round")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--admin-dsn", default=os.environ.get("AUTOM_BENCH_ADMIN_DSN", DEFAULT_ADMIN_DSN))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the server log (kept anyway after a stall)")
    args = parser.parse_args(argv)
    if args.events % args.chats:
        parser.error("--events must be a multiple of --chats")
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 1

    from autom.db.migrate import apply_migrations_sync

    name = f"autom_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    dsn = make_conninfo(args.admin_dsn, dbname=name)
    folder = Path(tempfile.mkdtemp(prefix="autom-load-"))
    keep = True  # until the run ended well
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        result = trio.run(load, args, dsn, folder)
        ok = print_report(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=str))
        log = next(folder.glob("*.stderr.log"), None)
        if log is not None:
            print(f"server log: {log.stat().st_size / 2**20:.1f} MB of JSON lines", flush=True)
        stalled = any(r["stall_s"] >= 3.0 for r in result["rounds"])
        keep = args.keep or stalled or not ok
        return 0 if ok else 1
    finally:
        if keep:
            print(f"logs kept in {folder}", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')


if __name__ == "__main__":
    sys.exit(main())
