"""Webhook → reply latency of an idle ``autom run``, and its resident memory (RSS) idle and after a burst.

    python bench/reply.py [--n 200] [--gap-ms 50] [--workers 8] [--burst 2000] [--out FILE]

What one run does:

1. creates a fresh, migrated database on ``--admin-dsn`` (dropped at the end);
2. serves the Telegram stub (``autom.testing.telegram_stub``) in this process on
   127.0.0.1: every call answered at once with 200; each call's arrival is stamped
   with ``time.time()`` when the stub's ASGI app receives it;
3. starts one real ``autom run`` (all roles; ``tests/support/processes.py``: JSON
   logs at info to a file, WORKERS=``--workers``, autom's default 8), waits until it
   serves and ``--settle`` seconds more, and reads its RSS (**RSS after start**);
4. sends ``--warmup`` and then ``--n`` signed Telegram ``/ping`` updates, one at a
   time, on ONE kept-alive HTTP/1.1 connection (h11 over a trio socket: no client
   library's work inside the timing), each to one of ``--chats`` chats in turn;
   after each it waits for the stub to receive that update's ``sendMessage``
   (``pong``), then sleeps ``--gap-ms`` × uniform(0.5, 1.5) (``random.Random(42)``,
   as bench/latency.py), so the service is idle when the next update arrives;
5. **latency** = ``time.time()`` just before the request's bytes are written → the
   stub received sendMessage (same machine, same clock). p50 / p99 (nearest rank) /
   min / max / mean over the ``--n`` updates. Where the time goes (from the same
   ``t0``): **answered** = the 202 read by the sender; **stored** = the event's
   ``received_at`` (the intake transaction's start, the server's clock); **claimed**
   = the job's ``claimed_at`` (the claim transaction's start); **claim → reply** =
   claimed → the stub received sendMessage;
6. a burst: ``--burst`` more updates over ``--burst-senders`` connections and 1,000
   chats, as fast as they are answered, with plain text (the handler logs it and
   sends nothing: Telegram's limits, ~30 messages/s a bot and 1/s a chat, would
   make a burst of replies take a minute); waits until every job is done,
   ``--settle`` seconds more, and reads the RSS again (**RSS after burst**; the peak is sampled
   every 0.2 s during the burst);
7. checks one ``pong`` per update, stops the service with SIGTERM (exit 0).

Each result is one JSON line (stdout and ``--out``): ``test: reply`` and ``test: rss``.
``--variant`` labels them (an older checkout put first on PYTHONPATH, as drain.py's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

from drain import ADMIN_DSN, bench_database, emit, log, pct  # noqa: E402 (bench/ is not a package)

CHAT_BASE = 7_000_000
BURST_CHAT_BASE = 8_000_000


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def threads(pid: int) -> int:
    """How many threads ``pid`` has."""
    return len(os.listdir(f"/proc/{pid}/task"))


def update_body(update_id: int, chat_id: int, text: str = "/ping") -> bytes:
    """A Telegram ``message`` update (``/ping``: the handler replies ``pong``)."""
    return json.dumps({
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 1700000000, "text": text,
                    "chat": {"id": chat_id, "type": "private"},
                    "from": {"id": chat_id, "is_bot": False, "first_name": "Bench"}},
    }).encode()


class Sender:
    """One kept-alive HTTP/1.1 connection (h11 over a trio socket) that POSTs updates."""

    def __init__(self, host: str, port: int, secret: str) -> None:
        self.host, self.port, self.secret = host, port, secret
        self.stream: Any = None
        self.conn: Any = None
        #: connections opened after the first (the server closed the kept-alive one)
        self.reconnects = -1

    async def _connect(self) -> None:
        import h11
        import trio

        if self.stream is not None:
            await self.stream.aclose()
        self.stream = await trio.open_tcp_stream(self.host, self.port)
        self.conn = h11.Connection(h11.CLIENT)
        self.reconnects += 1

    def request(self, body: bytes) -> bytes:
        """The request's bytes, built before the clock starts."""
        import h11

        if self.conn is None or self.conn.our_state is not h11.IDLE:
            return b""  # connect first (post() does)
        headers = [("Host", f"{self.host}:{self.port}"), ("Content-Type", "application/json"),
                   ("Content-Length", str(len(body))), ("X-Telegram-Bot-Api-Secret-Token", self.secret)]
        return (self.conn.send(h11.Request(method="POST", target="/hooks/telegram", headers=headers))
                + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))

    async def ready(self) -> None:
        """Connect (again) unless the connection can take the next request."""
        import h11

        if self.conn is None or self.conn.our_state is not h11.IDLE or self.conn.their_state is not h11.IDLE:
            await self._connect()

    async def send(self, data: bytes) -> int:
        """Write a request built by ``request`` and read its answer; returns the status."""
        import h11

        await self.stream.send_all(data)
        status = 0
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise RuntimeError("the server closed the connection before answering")
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return status

    async def post(self, body: bytes) -> int:
        await self.ready()
        return await self.send(self.request(body))

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


def summary(values_ms: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(values_ms), "p99_ms": pct(values_ms, 99), "min_ms": min(values_ms),
            "max_ms": max(values_ms), "mean_ms": statistics.fmean(values_ms)}


def breakdown(sent: dict[int, dict[str, float]], stamps: dict[int, tuple[float, float]]) -> dict[str, list[float]]:
    """Per part (ms from ``t0``): answered, stored, claimed, reply, and claimed → reply.

    ``sent``: update id → {"t0", "answered", "reply"} (wall clock, the sender's and the stub's);
    ``stamps``: update id → (event received_at, job claimed_at) (the server's clock).
    """
    parts: dict[str, list[float]] = {"answered": [], "stored": [], "claimed": [], "reply": [], "claim_to_reply": []}
    for update_id, s in sent.items():
        received, claimed = stamps[update_id]
        parts["answered"].append(1000 * (s["answered"] - s["t0"]))
        parts["stored"].append(1000 * (received - s["t0"]))
        parts["claimed"].append(1000 * (claimed - s["t0"]))
        parts["reply"].append(1000 * (s["reply"] - s["t0"]))
        parts["claim_to_reply"].append(1000 * (s["reply"] - claimed))
    return parts


def db_stamps(dsn: str) -> dict[int, tuple[float, float]]:
    """update id → (the event's received_at, the job's claimed_at), epoch seconds."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select (j.payload->>'update_id')::bigint, extract(epoch from e.received_at)::float8,"
            " extract(epoch from j.claimed_at)::float8 from jobs j join events e on e.id = j.event_id"
            " where j.kind = 'telegram.message'").fetchall()
    return {int(r[0]): (r[1], r[2]) for r in rows}


def drain_first(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """--drained N: N no-op jobs enqueued and drained by drain.py's worker in this database, first."""
    from drain import enqueue, run_worker

    recipients = args.drained_recipients
    enqueue(dsn, [(args.drained, (lambda i: f"r{i % recipients}") if recipients else (lambda i: None))], 1000)
    opts = argparse.Namespace(dsn_options=None, batch=None, pool_kwargs=None, variant=args.variant, py_spy=None,
                              out=args.out, workers=16, timeout=300.0)
    res = run_worker(dsn, opts, args.drained, "drained")
    if res.get("failed") or res.get("handled") != args.drained:
        raise RuntimeError(f"the drain before the series failed: {res}")
    log(f"drained {args.drained} jobs ({recipients or 'no'} recipients) in {res['drain_s']:.1f} s first")
    return {"jobs": args.drained, "recipients": recipients, "drain_s": res["drain_s"]}


def done_jobs(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("select count(*) from jobs where status = 'done'").fetchone()[0])  # type: ignore[index]


async def series(stub: Any, host: str, port: int, secret: str,
                 args: argparse.Namespace) -> tuple[dict[int, dict[str, float]], int]:
    """``--warmup`` + ``--n`` ``/ping`` updates one at a time on one kept-alive connection, each sent
    after the last one's sendMessage reached ``stub`` and a gap (step 4 above). Returns, for the
    counted ones, {update id: {"t0", "answered", "reply"}} (wall clock), and the reconnects."""
    import trio

    sender = Sender(host, port, secret)
    rng = random.Random(42)
    sent: dict[int, dict[str, float]] = {}
    for i in range(args.warmup + args.n):
        update_id = i + 1
        await sender.ready()
        data = sender.request(update_body(update_id, CHAT_BASE + i % args.chats))
        t0 = time.time()
        status = await sender.send(data)
        answered = time.time()
        if status != 202:
            raise RuntimeError(f"update {update_id}: HTTP {status}")
        with trio.fail_after(args.timeout):
            calls = await stub.wait_for_calls(i + 1, method="sendMessage")
        if i >= args.warmup:
            sent[update_id] = {"t0": t0, "answered": answered, "reply": calls[i].time}
        await trio.sleep(args.gap_ms / 1000 * rng.uniform(0.5, 1.5))
    await sender.aclose()
    return sent, sender.reconnects


async def measure(args: argparse.Namespace, dsn: str, folder: Path) -> dict[str, Any]:
    import trio

    from autom.testing.telegram_stub import running_stub
    from tests.support.processes import autom_processes
    from tests.support.service import TG_SECRET

    result: dict[str, Any] = {}
    async with running_stub() as stub, autom_processes(folder) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=stub.url, WORKERS=str(args.workers), LOG_LEVEL="info")
        host, port = proc.url.removeprefix("http://").rsplit(":", 1)
        log(f"autom run pid {proc.pid} at {proc.url} (WORKERS={args.workers}); stub at {stub.url}")
        await trio.sleep(args.settle)
        result["rss_start_mb"], result["threads_start"] = rss_mb(proc.pid), threads(proc.pid)

        result["sent"], result["reconnects"] = await series(stub, host, int(port), TG_SECRET, args)
        result["rss_series_mb"] = rss_mb(proc.pid)

        peak = [result["rss_series_mb"]]
        total = args.warmup + args.n + args.burst

        async def sample() -> None:
            while True:
                peak.append(rss_mb(proc.pid))
                await trio.sleep(0.2)

        async def burst_sender(k: int, ids: range) -> None:
            s = Sender(host, int(port), TG_SECRET)
            try:
                for update_id in ids:
                    status = await s.post(update_body(update_id, BURST_CHAT_BASE + update_id % 1000, "hello"))
                    if status != 202:
                        raise RuntimeError(f"burst update {update_id}: HTTP {status}")
            finally:
                await s.aclose()

        if args.burst:
            started = time.monotonic()
            first = args.warmup + args.n + 1
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                async with trio.open_nursery() as senders:
                    for k in range(args.burst_senders):
                        senders.start_soon(burst_sender, k, range(first + k, total + 1, args.burst_senders))
                result["burst_answered_s"] = time.monotonic() - started
                with trio.fail_after(max(args.timeout, 120)):
                    while await trio.to_thread.run_sync(done_jobs, dsn) < total + args.drained:  # noqa: ASYNC110 (polls the database)
                        await trio.sleep(0.2)
                result["burst_done_s"] = time.monotonic() - started
                nursery.cancel_scope.cancel()
            await trio.sleep(args.settle)
        result["rss_peak_mb"] = max(peak)
        result["rss_burst_mb"], result["threads_burst"] = rss_mb(proc.pid), threads(proc.pid)
        result["pongs"] = len([c for c in stub.calls_of("sendMessage") if c.params.get("text") == "pong"])
        result["expected_pongs"] = args.warmup + args.n
        proc.terminate()
        result["exit_code"] = await proc.wait(timeout=30)
    return result


def run(args: argparse.Namespace) -> int:
    import trio

    folder = Path(tempfile.mkdtemp(prefix="autom-reply-"))
    ok = False
    try:
        with bench_database(args.admin_dsn, "bench_reply", keep=args.keep_db) as dsn:
            drained = drain_first(dsn, args) if args.drained else None
            res = trio.run(measure, args, dsn, folder)
            stamps = db_stamps(dsn)
        sent = res.pop("sent")
        parts = breakdown(sent, stamps)
        load = os.getloadavg()[0]
        import autom

        rec = {"system": "autom", "test": "reply", "variant": args.variant, "n": len(sent), "gap_ms": args.gap_ms,
               "autom_src": str(Path(autom.__file__).parent),
               "workers": args.workers, "drained": drained, **summary(parts["reply"]),
               "parts_p50_ms": {k: statistics.median(v) for k, v in parts.items()},
               "parts_p99_ms": {k: pct(v, 99) for k, v in parts.items()},
               "reconnects": res["reconnects"], "load_1min": load}
        emit(rec, args.out)
        p50 = rec["parts_p50_ms"]
        who = "autom reply after a drain" if drained else "autom reply"
        log(f"{who}: p50 {rec['p50_ms']:.2f} ms, p99 {rec['p99_ms']:.2f} ms (min {rec['min_ms']:.2f}, "
            f"max {rec['max_ms']:.2f}); p50 from the POST: answered {p50['answered']:.2f}, stored "
            f"{p50['stored']:.2f}, claimed {p50['claimed']:.2f}, claim → reply {p50['claim_to_reply']:.2f}; "
            f"reconnects {res['reconnects']}; load {load:.2f}")
        rss = {"system": "autom", "test": "rss", "variant": args.variant, "workers": args.workers,
               "start_mb": res["rss_start_mb"], "after_series_mb": res["rss_series_mb"],
               "burst": args.burst, "peak_mb": res["rss_peak_mb"], "after_burst_mb": res["rss_burst_mb"],
               "threads_start": res["threads_start"], "threads_burst": res["threads_burst"],
               "burst_answered_s": res.get("burst_answered_s"), "burst_done_s": res.get("burst_done_s"),
               "load_1min": os.getloadavg()[0]}
        emit(rss, args.out)
        log(f"autom rss: {rss['start_mb']:.1f} MB after start, {rss['after_series_mb']:.1f} after the series, "
            f"peak {rss['peak_mb']:.1f}, {rss['after_burst_mb']:.1f} after a burst of {args.burst} "
            f"({rss['threads_start']} → {rss['threads_burst']} threads)")
        ok = res["pongs"] == res["expected_pongs"] and res["exit_code"] == 0
        if not ok:
            log(f"PROBLEM: {res['pongs']} pongs for {res['expected_pongs']} updates, exit {res['exit_code']}")
        return 0 if ok else 1
    finally:
        if ok and not args.keep_db:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            log(f"server log kept in {folder}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--admin-dsn", default=ADMIN_DSN)
    parser.add_argument("--n", type=int, default=int(os.environ.get("REPLY_N", "200")))
    parser.add_argument("--warmup", type=int, default=5, help="updates sent first and not counted")
    parser.add_argument("--gap-ms", type=float, default=float(os.environ.get("LAT_GAP_MS", "50")))
    parser.add_argument("--chats", type=int, default=100,
                        help="the series' updates come from this many chats in turn (each chat may get one "
                             "message a second: keep chats × gap well above 1 s)")
    parser.add_argument("--workers", type=int, default=8, help="WORKERS of autom run (its default: 8)")
    parser.add_argument("--burst", type=int, default=int(os.environ.get("REPLY_BURST", "2000")),
                        help="updates in the burst before the second RSS reading (0: none)")
    parser.add_argument("--burst-senders", type=int, default=16)
    parser.add_argument("--settle", type=float, default=2.0, help="idle seconds before each RSS reading")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one reply may take")
    parser.add_argument("--drained", type=int, default=0,
                        help="first drain this many no-op jobs in the same database (drain.py's worker): "
                             "the series then runs among that many finished jobs")
    parser.add_argument("--drained-recipients", type=int, default=0,
                        help="the drained jobs' recipients (0: none, N: r0..rN-1 in turn)")
    parser.add_argument("--variant", default=None, help="which autom this is (see drain.py --variant)")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    if args.chats * args.gap_ms * 0.5 < 1200:
        parser.error("--chats × --gap-ms must leave each chat 1.2 s between messages (Telegram's 1/s a chat "
                     "would defer replies)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
