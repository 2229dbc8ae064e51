"""Admission load test: a flood, slow bodies, bad signatures and a full backlog against one intake.

    python bench/admission.py [--seconds 8] [--client-rate 50] [--normal-rate 20]

Everything goes to 127.0.0.1 and is bounded in count and time (about a minute in
all). What it does:

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL) and
   applies the migrations;
2. starts the intake alone in a child process (this file with ``serve``:
   ``open_database`` + ``create_app`` + ``serve_http``, no workers, so jobs stay
   pending), with CLIENT_RATE=``--client-rate``, TRUSTED_PROXIES=127.0.0.1 (each
   simulated client is named by its X-Forwarded-For: they all come from this
   machine) and MAX_PENDING_JOBS=``--max-pending``;
3. runs the scenarios, each for ``--seconds``, every request on a new connection
   (as a webhook sender does), paced open-loop (a slow answer does not slow the
   sender down):

   * **baseline**: the normal client alone: signed ``site`` deliveries at
     ``--normal-rate`` per second; its p50/p99;
   * **flood**: one client at 10 x CLIENT_RATE while the normal client sends as
     before: the normal client's answers and p99 against the baseline, the
     flood's 202/429 split;
   * **slow bodies**: 200 connections that send a head and 10 bytes of a 1,000-byte
     body, then nothing, while the normal client sends: its p99, and how the slow
     ones ended (408 and closed after the 10 s body deadline);
   * **bad signatures**: one client sending wrongly signed deliveries as fast as
     it can (8 at a time) while the normal client sends;
   * **backlog**: ``site`` deliveries push unfinished jobs over MAX_PENDING_JOBS and
     then twice that while a ``stripe`` sender probes: which answers each got at
     each level, then the jobs are marked done (workers would) and both get 202
     again;

4. checks that the database holds exactly one event per 202 (nothing accepted is
   lost), prints a report (also as JSON with ``--json``), stops the server with
   SIGTERM and drops the database. The load of the machine (other engineers' work
   included) is printed beside the figures: ``os.getloadavg`` and the share of
   CPU time not spent by this benchmark's processes.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SITE_SECRET = "bench-site-secret"
STRIPE_SECRET = "whsec_bench-stripe"
TELEGRAM_SECRET = "bench-telegram-secret"


# --- the server -----------------------------------------------------------------------------


def serve(dsn: str, client_rate: float, max_pending: int, log_file: str) -> None:
    """Run the intake alone until SIGTERM; print ``READY <url>`` once it listens."""
    import logging
    from functools import partial

    import trio

    from autom.config import Settings
    from autom.db import open_database
    from autom.deps import Deps
    from autom.jobs.store import JobStore
    from autom.logs import JsonFormatter
    from autom.sources import enabled_sources
    from autom.web import create_app, serve_http

    handler = logging.FileHandler(log_file)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)

    settings = Settings(
        site_webhook_secret=SITE_SECRET, stripe_webhook_secret=STRIPE_SECRET,
        telegram_webhook_secret=TELEGRAM_SECRET, host="127.0.0.1", shutdown_grace_seconds=5,
        client_rate=client_rate, trusted_proxies="127.0.0.1", max_pending_jobs=max_pending,
    )

    async def main() -> None:
        async with open_database(dsn, min_size=8, max_size=16, pool_timeout=5.0) as db:
            deps = Deps(settings=settings, db=db, store=JobStore(db), sources=enabled_sources(settings),
                        telegram=None)  # type: ignore[arg-type]
            app = create_app(deps)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_on_signal, deps)
                urls = await nursery.start(partial(serve_http, deps, app, binds=["127.0.0.1:0"]))
                print("READY", urls[0], flush=True)

    async def _stop_on_signal(deps: Any) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                deps.shutdown.value = True
                return

    trio.run(main)


# --- requests -------------------------------------------------------------------------------


_counter = iter(range(1, 10**9))


def site_request(client: str, *, bad: bool = False) -> bytes:
    """A signed (or, with ``bad``, wrongly signed) site delivery from ``client``, as raw HTTP/1.1."""
    body = json.dumps({"id": f"b-{uuid.uuid4().hex}", "n": next(_counter)}).encode()
    key = (b"wrong-" if bad else b"") + SITE_SECRET.encode()
    sig = hmac.new(key, body, hashlib.sha256).hexdigest()
    return _raw("/hooks/site", client, {"X-Signature": f"sha256={sig}"}, body)


def stripe_request(client: str) -> bytes:
    """A signed Stripe delivery from ``client``."""
    body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "charge.succeeded", "data": {}}).encode()
    t = int(time.time())
    sig = hmac.new(STRIPE_SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return _raw("/hooks/stripe", client, {"Stripe-Signature": f"t={t},v1={sig}"}, body)


def _raw(path: str, client: str, headers: dict[str, str], body: bytes, length: int | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: bench", "Content-Type: application/json",
             f"Content-Length: {len(body) if length is None else length}", f"X-Forwarded-For: {client}",
             "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def exchange(port: int, raw: bytes, limit_s: float = 15.0) -> tuple[int, float]:
    """Send ``raw`` on a new connection; (status, seconds) once the answer is in (status 0: failed)."""
    import trio

    started = time.perf_counter()
    try:
        with trio.fail_after(limit_s):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(raw)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    data += chunk
    except (OSError, trio.TooSlowError, trio.BrokenResourceError):
        return 0, time.perf_counter() - started
    elapsed = time.perf_counter() - started
    try:
        return int(data.split(b" ", 2)[1]), elapsed
    except (IndexError, ValueError):
        return 0, elapsed


@dataclass
class Sender:
    """One paced, open-loop sender: its answers and latencies."""

    name: str
    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def note(self, status: int, seconds: float) -> None:
        """Record one answer."""
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status:
            self.latencies.append(seconds)

    def summary(self) -> dict[str, Any]:
        """Counts by status, p50/p99 in ms."""
        return {"sent": sum(self.statuses.values()), "statuses": dict(sorted(self.statuses.items())),
                "p50_ms": _pct(self.latencies, 50), "p99_ms": _pct(self.latencies, 99)}


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1)] * 1000, 2)


async def paced(port: int, sender: Sender, make: Any, rate: float, seconds: float) -> None:
    """Send ``make()`` requests at ``rate`` per second for ``seconds`` (open loop)."""
    import trio

    async def one(raw: bytes) -> None:
        sender.note(*await exchange(port, raw))

    start = trio.current_time()
    total = int(rate * seconds)
    async with trio.open_nursery() as nursery:
        for i in range(total):
            await trio.sleep_until(start + i / rate)
            nursery.start_soon(one, make())


async def as_fast_as_possible(port: int, sender: Sender, make: Any, seconds: float, lanes: int = 8) -> None:
    """Send ``make()`` requests back to back on ``lanes`` lanes for ``seconds``."""
    import trio

    deadline = trio.current_time() + seconds

    async def lane() -> None:
        while trio.current_time() < deadline:
            sender.note(*await exchange(port, make()))

    async with trio.open_nursery() as nursery:
        for _ in range(lanes):
            nursery.start_soon(lane)


# --- the scenarios --------------------------------------------------------------------------


async def scenarios(port: int, args: argparse.Namespace, dsn: str, pid: int) -> dict[str, Any]:
    """Run every scenario; the report as a dict."""
    import psycopg
    import trio

    def normal() -> bytes:
        return site_request("198.51.100.10")

    report: dict[str, Any] = {}
    secs = args.seconds

    async def drained() -> None:
        # the workers' part (none run here): the scenarios before the backlog one must
        # not fill it; the estimate refreshes every second
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("update jobs set status = 'done', finished_at = now() where status = 'pending'")
        await trio.sleep(1.5)

    def server_cpu(name: str, started: float, *senders: Sender) -> None:
        # the server's CPU time per request of the scenario (its own process only)
        requests = sum(sum(x.statuses.values()) for x in senders)
        report[name]["server_cpu_ms_per_request"] = round((_cpu_seconds([pid]) - started) * 1000 / requests, 3)

    base = Sender("normal")
    cpu = _cpu_seconds([pid])
    await paced(port, base, normal, args.normal_rate, secs)
    report["baseline"] = {"normal": base.summary()}
    server_cpu("baseline", cpu, base)

    await drained()
    flood, during = Sender("flood"), Sender("normal")
    cpu = _cpu_seconds([pid])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(paced, port, flood, lambda: site_request("203.0.113.66"), 10 * args.client_rate, secs)
        nursery.start_soon(paced, port, during, normal, args.normal_rate, secs)
    report["flood"] = {"flood": flood.summary(), "normal": during.summary(),
                       "flood_rate_per_s": 10 * args.client_rate}
    server_cpu("flood", cpu, flood, during)

    await drained()
    slow, during = Sender("slow"), Sender("normal")

    async def slow_one() -> None:
        raw = _raw("/hooks/site", f"192.0.2.{next(_counter) % 250}", {"X-Signature": "sha256=" + "0" * 64},
                   b'{"id": "sl', length=1000)
        started = time.perf_counter()
        status = 0
        try:
            with trio.fail_after(30):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(raw)
                    data = b""
                    while chunk := await stream.receive_some(65536):
                        data += chunk  # until the server closes
                    status = int(data.split(b" ", 2)[1]) if data else -1  # -1: closed without an answer
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, IndexError, ValueError):
            status = 0
        slow.note(status, time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        for _ in range(200):
            nursery.start_soon(slow_one)
        await trio.sleep(0.5)  # all 200 are in
        await paced(port, during, normal, args.normal_rate, secs)
    report["slow_bodies"] = {"slow": slow.summary(), "normal": during.summary()}

    await drained()
    bad, during = Sender("bad"), Sender("normal")
    cpu = _cpu_seconds([pid])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(as_fast_as_possible, port, bad, lambda: site_request("203.0.113.99", bad=True), secs)
        nursery.start_soon(paced, port, during, normal, args.normal_rate, secs)
    report["bad_signatures"] = {"bad": bad.summary(), "normal": during.summary(),
                                "bad_rate_per_s": round(sum(bad.statuses.values()) / secs, 1)}
    server_cpu("bad_signatures", cpu, bad, during)

    report["backlog"] = await backlog(port, args, dsn)

    with psycopg.connect(dsn, autocommit=True) as conn:
        events = conn.execute("select count(*) from events").fetchone()[0]  # type: ignore[index]
    accepted = sum(s.get("statuses", {}).get(202, 0) for scen in report.values() if isinstance(scen, dict)
                   for s in scen.values() if isinstance(s, dict))
    report["check"] = {"events": events, "accepted_202": accepted + report["backlog"]["accepted_202"],
                       "lost": accepted + report["backlog"]["accepted_202"] - events}
    return report


async def backlog(port: int, args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    """Fill the backlog past the cap and twice the cap, probe with stripe and site, drain, probe again."""
    import psycopg
    import trio

    cap = args.max_pending
    steps: list[dict[str, Any]] = []
    accepted = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("update jobs set status = 'done', finished_at = now() where status = 'pending'")

        def unfinished() -> int:
            return int(conn.execute("select count(*) from jobs where due_at is not null").fetchone()[0])  # type: ignore[index]

        async def probe(label: str) -> None:
            nonlocal accepted
            await trio.sleep(1.5)  # the estimate refreshes every second
            stripe = await exchange(port, stripe_request(f"198.51.100.{20 + len(steps)}"))
            site = await exchange(port, site_request(f"198.51.100.{40 + len(steps)}"))
            accepted += (stripe[0] == 202) + (site[0] == 202)
            steps.append({"at": label, "unfinished": unfinished(), "stripe": stripe[0], "site": site[0]})

        async def fill(target: int) -> None:
            # jobs up to 20 short of the target straight into the table (as other replicas'
            # deliveries would), the last 20 through this intake as site deliveries
            nonlocal accepted
            missing = target - unfinished() - 20
            if missing > 0:
                conn.execute("insert into jobs (kind) select 'bench.filler' from generate_series(1, %s)",
                             [missing])
            filler = Sender("filler")
            while unfinished() < target:
                filler.note(*await exchange(port, site_request(f"198.51.101.{len(filler.latencies) % 250}")))
                if filler.statuses.get(503):
                    break
            accepted += filler.statuses.get(202, 0)

        await probe("empty")
        await fill(cap)
        await probe("at the cap")
        await fill(2 * cap)
        await probe("at twice the cap")
        drained_at = time.perf_counter()
        conn.execute("update jobs set status = 'done', finished_at = now() where status = 'pending'")
        await probe("drained")
        steps[-1]["seconds_after_drain"] = round(time.perf_counter() - drained_at, 2)
    return {"max_pending_jobs": cap, "steps": steps, "accepted_202": accepted}


# --- the driver -----------------------------------------------------------------------------


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _machine_busy() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def drive(args: argparse.Namespace) -> int:
    """Create the database, start the server, run the scenarios, clean up."""
    import psycopg
    import trio
    from psycopg.conninfo import make_conninfo

    from autom.db.migrate import apply_migrations_sync

    dbname = f"autom_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{dbname}"')
    dsn = make_conninfo(args.admin_dsn, dbname=dbname)
    tmp = Path(tempfile.mkdtemp(prefix="autom-bench-"))
    server: subprocess.Popen[str] | None = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", "--dsn", dsn, "--client-rate", str(args.client_rate),
             "--max-pending", str(args.max_pending), "--log-file", str(tmp / "server.log")],
            stdout=subprocess.PIPE, text=True,
        )
        assert server.stdout is not None
        ready = server.stdout.readline().split()
        if not ready or ready[0] != "READY":
            print("the server did not start", file=sys.stderr)
            return 1
        port = int(ready[1].rsplit(":", 1)[1])
        load_before = os.getloadavg()
        ours_before = _cpu_seconds([server.pid, os.getpid()])
        busy_before, wall_before = _machine_busy(), time.monotonic()
        report = trio.run(scenarios, port, args, dsn, server.pid)
        wall = time.monotonic() - wall_before
        ours = _cpu_seconds([server.pid, os.getpid()]) - ours_before
        busy = _machine_busy() - busy_before
        report["machine"] = {
            "cores": os.cpu_count(), "wall_s": round(wall, 1),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "busy_share": round(busy / wall / (os.cpu_count() or 1), 3),
            "others_share": round(max(0.0, busy - ours) / wall / (os.cpu_count() or 1), 3),
        }
        refusal_lines = sum(1 for line in (tmp / "server.log").read_text().splitlines()
                            if "refus" in line)
        report["log"] = {"refusal_lines": refusal_lines}
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        with psycopg.connect(args.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{dbname}" with (force)')
    print(json.dumps(report, indent=1) if args.json else _text(report, args))
    return 0 if report["check"]["lost"] == 0 else 1


def _text(r: dict[str, Any], args: argparse.Namespace) -> str:
    base = r["baseline"]["normal"]
    lines = [f"admission bench: CLIENT_RATE={args.client_rate}/s, normal sender {args.normal_rate}/s, "
             f"{args.seconds:g} s per scenario, MAX_PENDING_JOBS={args.max_pending}",
             f"machine: {r['machine']}",
             f"baseline   normal {base}"]
    for name in ("flood", "slow_bodies", "bad_signatures"):
        scen = r[name]
        normal = scen["normal"]
        ratio = normal["p99_ms"] / base["p99_ms"] if base["p99_ms"] else math.nan
        others = {k: v for k, v in scen.items() if k not in ("normal", "server_cpu_ms_per_request")}
        lines.append(f"{name:<14} normal {normal} p99 x{ratio:.2f} | {others} | server CPU "
                     f"{scen.get('server_cpu_ms_per_request', '-')} ms/request")
    for step in r["backlog"]["steps"]:
        lines.append(f"backlog   {step}")
    lines.append(f"log: {r['log']}  check: {r['check']}")
    return "\n".join(lines)


def main() -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command")
    srv = sub.add_parser("serve", help="(internal) run the intake server")
    srv.add_argument("--dsn", required=True)
    srv.add_argument("--client-rate", type=float, required=True)
    srv.add_argument("--max-pending", type=int, required=True)
    srv.add_argument("--log-file", default=os.devnull)
    parser.add_argument("--admin-dsn", default=os.environ.get("AUTOM_BENCH_ADMIN_DSN",
                                                              "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per scenario")
    parser.add_argument("--client-rate", type=float, default=50.0, help="CLIENT_RATE of the server")
    parser.add_argument("--normal-rate", type=float, default=20.0, help="the normal sender's requests/s")
    parser.add_argument("--max-pending", type=int, default=5000, help="MAX_PENDING_JOBS of the server")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.dsn, args.client_rate, args.max_pending, args.log_file)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())

