"""The floor: the least a service with autom's guarantees does on this machine, in plain psycopg.

    python bench/floor.py [--n 200] [--gap-ms 50] [--parts idle,reply] [--out FILE]
    python bench/floor.py idle-worker|reply-server ...     (internal) the child processes

No framework, no pool, no bridge: what any service that keeps the same promises must
pay (durable commits, a LISTEN wake-up, a claim that survives a crash, a reply after
the claim), so autom's latencies can be read as ratios to it (bench/speed.py). Both
parts run in a fresh database on ``--admin-dsn`` (dropped at the end) with two tables
of their own (``floor_events``, ``floor_jobs``: an event unique per source and dedup
key, a job with status, attempts, lease end) and a partial index of pending jobs.

**idle** (enqueue → start, as bench/latency.py): a worker process LISTENs on its own
connection; the driver (this process) enqueues ``--n`` jobs one at a time, each ONE
statement in autocommit (insert + ``pg_notify``: one durable commit), ``t0 =
time.time()`` just before it and in the payload, then sleeps ``--gap-ms`` ×
uniform(0.5, 1.5) (``random.Random(42)``), after READY and 1 s of settling, as
latency.py does. The worker, woken by the notification, runs the claim (one UPDATE of
the oldest pending job, ``for update skip locked``, attempts + 1, a 30 s lease) and
takes "start" when it returns. The claim commits without waiting for the disk, as
autom's idle claim does (README, Fencing: a claim lost in a crash is a job that runs
again, which at-least-once allows; autom confirms it durably while the handler starts,
off this path); ``--durable-claim`` makes it wait. Latency = start − t0; parts:
enqueue (the insert's call), wake (enqueue returned → claim began), claim.

**reply** (webhook → reply, as bench/reply.py): a server process on trio with bare h11
(HTTP/1.1 keep-alive, no framework): for each ``POST /hooks/telegram`` it checks the
secret header, stores the event and its job in ONE durable statement, answers 202,
claims the job (the same UPDATE), POSTs ``sendMessage`` ``pong`` to the Telegram stub
(``autom.testing.telegram_stub``, served by the driver, as reply.py) on a kept-alive
h11 connection, and marks the job done (asynchronous commit, after the reply, as
autom's completer). Its database calls run in a worker thread (``trio.to_thread``):
a trio service cannot block its loop on psycopg. The driver sends ``--warmup`` + ``--n``
signed ``/ping`` updates on one kept-alive connection (reply.py's ``Sender``), each
after the last one's pong and a gap as above. Latency = t0 → the stub received
sendMessage; parts: answered, stored (the event's ``received_at``), claimed
(``claimed_at``), claim → reply.

Each part prints one line and emits one JSON line (``system: floor``, ``test: idle`` or
``reply``) to stdout and ``--out``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SELF = str(HERE / "floor.py")
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

from drain import ADMIN_DSN, bench_database, emit, log, pct  # noqa: E402 (bench/ is not a package)
from reply import Sender, breakdown, series, summary  # noqa: E402

SCHEMA = """
create table floor_events (
    id bigint generated always as identity primary key,
    source text not null, body text not null, dedup_key text,
    received_at timestamptz not null default now(),
    unique (source, dedup_key));
create table floor_jobs (
    id bigint generated always as identity primary key,
    event_id bigint references floor_events (id),
    payload jsonb not null,
    status text not null default 'pending',
    attempts integer not null default 0,
    run_at timestamptz not null default now(),
    locked_until timestamptz, claimed_at timestamptz, finished_at timestamptz);
create index floor_jobs_pending on floor_jobs (run_at, id) where status = 'pending';
"""
ENQUEUE = ("with j as (insert into floor_jobs (payload) values (%s) returning id)"
           " select id, pg_notify('floor_jobs', '') from j")
CLAIM = ("with s as (select set_config('synchronous_commit', 'off', true) as off)"  # see the docstring
         " update floor_jobs set status = 'running', attempts = attempts + 1, claimed_at = now(),"
         " locked_until = now() + interval '30 seconds' from s"
         " where id = (select id from floor_jobs where status = 'pending' and run_at <= now()"
         " order by run_at, id limit 1 for update skip locked) returning id, payload")


def claim_sql(durable: bool) -> str:
    """The claim, committed asynchronously or (``durable``) waiting for the flush."""
    return CLAIM.replace("'off'", "'on'") if durable else CLAIM


STORE = ("with ev as (insert into floor_events (source, body, dedup_key) values ('telegram', %s, %s)"
         " on conflict (source, dedup_key) do nothing returning id)"
         " insert into floor_jobs (event_id, payload) select id, %s from ev returning id")
DONE = ("with s as (select set_config('synchronous_commit', 'off', true) as off)"  # an asynchronous commit
        " update floor_jobs set status = 'done', finished_at = now() from s where id = %s")
SECRET = "floor-secret"
TOKEN = "123:floor"


# --- idle: enqueue → start ------------------------------------------------------------------


def idle_worker(args: argparse.Namespace) -> None:
    """LISTEN, claim on every notification until ``--n`` jobs started; print their times as JSON."""
    import psycopg

    listen = psycopg.connect(args.dsn, autocommit=True)
    claim = psycopg.connect(args.dsn, autocommit=True)
    listen.execute("listen floor_jobs")
    sql = claim_sql(args.durable_claim)
    claim.execute(sql).fetchall()  # nothing pending: prepares the connection's first statement
    print("READY", flush=True)
    seen: dict[int, dict[str, float]] = {}
    deadline = time.monotonic() + args.timeout
    while len(seen) < args.n and time.monotonic() < deadline:
        for _ in listen.notifies(timeout=1.0, stop_after=1):
            pass
        while True:  # every job this notification may stand for; the empty claim is after "start"
            c0 = time.time()
            row = claim.execute(sql).fetchone()
            c1 = time.time()
            if row is None:
                break
            seen[row[0]] = {"t0": row[1]["t0"], "claim_start": c0, "start": c1}
    print(json.dumps(seen), flush=True)


def run_idle(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg
    from psycopg.types.json import Jsonb

    cmd = [sys.executable, SELF, "idle-worker", "--dsn", dsn, "--n", str(args.n),
           "--timeout", str(args.timeout)] + (["--durable-claim"] if args.durable_claim else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError("the floor's worker did not start")
        time.sleep(1.0)  # as latency.py: settle into the idle wait
        sent: dict[int, tuple[float, float]] = {}
        rng = random.Random(42)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(args.n):
                t0 = time.time()
                row = conn.execute(ENQUEUE, (Jsonb({"t0": t0}),)).fetchone()
                sent[row[0]] = (t0, time.time())  # type: ignore[index]
                time.sleep(args.gap_ms / 1000 * rng.uniform(0.5, 1.5))
        out, _ = proc.communicate(timeout=args.timeout + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    jobs = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    if set(sent) - set(jobs):
        raise RuntimeError(f"{len(set(sent) - set(jobs))} jobs were not claimed")
    total, enq, wake, claim = [], [], [], []
    for job_id, (t0, returned) in sent.items():
        j = jobs[job_id]
        total.append(1000 * (j["start"] - t0))
        enq.append(1000 * (returned - t0))
        wake.append(1000 * (j["claim_start"] - returned))
        claim.append(1000 * (j["start"] - j["claim_start"]))
    parts = {"enqueue": enq, "wake": wake, "claim": claim}
    return {"system": "floor", "test": "idle", "n": len(total), "gap_ms": args.gap_ms,
            "durable_claim": args.durable_claim, **summary(total),
            "parts_p50_ms": {k: statistics.median(v) for k, v in parts.items()},
            "parts_p99_ms": {k: pct(v, 99) for k, v in parts.items()}, "load_1min": os.getloadavg()[0]}


# --- reply: webhook → reply -----------------------------------------------------------------


class Db:
    """One psycopg connection (autocommit) used from trio through a worker thread, one call at a time."""

    def __init__(self, dsn: str) -> None:
        import psycopg
        import trio

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.lock = trio.Lock()

    async def one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import trio

        async with self.lock:
            return await trio.to_thread.run_sync(self._one, sql, params)

    def _one(self, sql: str, params: tuple[Any, ...]) -> Any:
        cur = self.conn.execute(sql, params)
        return cur.fetchone() if cur.description else None


class StubClient(Sender):
    """A kept-alive HTTP/1.1 connection (h11) to the Telegram stub: reply.py's ``Sender``, POSTing JSON."""

    async def post_json(self, path: str, data: dict[str, Any]) -> int:
        import h11

        await self.ready()
        body = json.dumps(data).encode()
        headers = [("Host", f"{self.host}:{self.port}"), ("Content-Type", "application/json"),
                   ("Content-Length", str(len(body)))]
        return await self.send(self.conn.send(h11.Request(method="POST", target=path, headers=headers))
                               + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))


def reply_server(args: argparse.Namespace) -> None:
    """Serve the floor's webhook on 127.0.0.1 (prints "LISTENING <port>") until stdin closes."""
    import h11
    import trio
    from psycopg.types.json import Jsonb

    async def main() -> None:
        store, claimer = Db(args.dsn), Db(args.dsn)
        host, port = args.stub_url.removeprefix("http://").rsplit(":", 1)
        stub = StubClient(host, int(port), "")

        async def handle(request: Any, body: bytes) -> int:
            headers = {k.decode().lower(): v.decode() for k, v in request.headers}
            if not hmac.compare_digest(headers.get("x-telegram-bot-api-secret-token", "").encode(),
                                       SECRET.encode()):
                return 401
            update = json.loads(body)
            chat = update["message"]["chat"]["id"]
            await store.one(STORE, (body.decode(), str(update["update_id"]),
                                    Jsonb({"update_id": update["update_id"], "chat": chat})))
            return 202

        async def work() -> None:
            while True:  # claim what the store made; reply; done
                row = await claimer.one(claim_sql(args.durable_claim))
                if row is None:
                    return
                await stub.post_json(f"/bot{TOKEN}/sendMessage", {"chat_id": row[1]["chat"], "text": "pong"})
                await claimer.one(DONE, (row[0],))

        async def connection(stream: Any) -> None:
            conn = h11.Connection(h11.SERVER)
            request, body = None, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request, body = event, b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    status = await handle(request, body)
                    await stream.send_all(conn.send(h11.Response(status_code=status, headers=[
                        ("Content-Length", "0")])) + conn.send(h11.EndOfMessage()))
                    conn.start_next_cycle()
                    if status == 202:
                        await work()
                elif isinstance(event, h11.ConnectionClosed):
                    return

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        print(f"LISTENING {listeners[0].socket.getsockname()[1]}", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, connection, listeners)
            await trio.to_thread.run_sync(sys.stdin.read)  # the driver closes stdin: stop
            nursery.cancel_scope.cancel()

    trio.run(main)


async def measure_reply(dsn: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    import trio

    from autom.testing.telegram_stub import running_stub

    async with running_stub() as stub:
        cmd = [sys.executable, SELF, "reply-server", "--dsn", dsn, "--stub-url", stub.url]
        cmd += ["--durable-claim"] if args.durable_claim else []
        proc = await trio.lowlevel.open_process(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)  # type: ignore[union-attr]
                if not chunk:
                    raise RuntimeError("the floor's server did not start")
                line += chunk
            port = int(line.split()[1])
            await trio.sleep(args.settle)
            sent, _ = await series(stub, "127.0.0.1", port, SECRET, args)
        finally:
            await proc.stdin.aclose()  # type: ignore[union-attr]
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return sent


def run_reply(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg
    import trio

    sent = trio.run(measure_reply, dsn, args)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("select (j.payload->>'update_id')::bigint, extract(epoch from e.received_at)::float8,"
                            " extract(epoch from j.claimed_at)::float8 from floor_jobs j"
                            " join floor_events e on e.id = j.event_id").fetchall()
    parts = breakdown(sent, {int(r[0]): (r[1], r[2]) for r in rows})
    return {"system": "floor", "test": "reply", "n": len(sent), "gap_ms": args.gap_ms,
            "durable_claim": args.durable_claim, **summary(parts["reply"]),
            "parts_p50_ms": {k: statistics.median(v) for k, v in parts.items()},
            "parts_p99_ms": {k: pct(v, 99) for k, v in parts.items()}, "load_1min": os.getloadavg()[0]}


def describe(rec: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in rec["parts_p50_ms"].items())
    return (f"floor {rec['test']}: p50 {rec['p50_ms']:.2f} ms, p99 {rec['p99_ms']:.2f} ms (min {rec['min_ms']:.2f}, "
            f"max {rec['max_ms']:.2f}); p50 parts: {parts}; load {rec['load_1min']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", nargs="?", default="drive", choices=["drive", "idle-worker", "reply-server"])
    parser.add_argument("--admin-dsn", default=ADMIN_DSN)
    parser.add_argument("--dsn", help="(internal) the database")
    parser.add_argument("--stub-url", help="(internal) the Telegram stub")
    parser.add_argument("--parts", default="idle,reply")
    parser.add_argument("--n", type=int, default=int(os.environ.get("LAT_N", "200")), help="samples per part")
    parser.add_argument("--gap-ms", type=float, default=float(os.environ.get("LAT_GAP_MS", "50")))
    parser.add_argument("--warmup", type=int, default=5, help="(reply) updates sent first and not counted")
    parser.add_argument("--chats", type=int, default=100, help="(reply) chats the updates come from in turn")
    parser.add_argument("--settle", type=float, default=2.0, help="(reply) idle seconds after the server starts")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--durable-claim", action="store_true", help="the claim waits for its commit's flush")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    if args.command == "idle-worker":
        idle_worker(args)
        return 0
    if args.command == "reply-server":
        reply_server(args)
        return 0
    import psycopg

    with bench_database(args.admin_dsn, "bench_floor", keep=args.keep_db) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
            rec = run_idle(dsn, args) if part == "idle" else run_reply(dsn, args)
            emit(rec, args.out)
            log(describe(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
