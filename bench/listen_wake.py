"""NOTIFY → ``on_notify`` in trio: how fast ``Database.listen`` hands a notification over.

One process: ``db.listen`` on a channel, and a sender on a plain sync psycopg
connection of its own (the same for any autom checkout, so that only the
listener differs) that sends ``--n`` notifications ``--gap-ms`` apart. Each
figure is from just before the sender's ``pg_notify`` to the listener's callback
(the commit included). Compare checkouts with PYTHONPATH, interleaved (see
bench/db_calls.py). Then ``--idle`` seconds with the listener running and
nothing sent: the process's CPU meanwhile (a listener that polls costs some).
Prints one JSON line: p50/p99/max in ms, idle CPU in ms per second.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import psycopg
import trio

from autom.db import open_database


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("AUTOM_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle listening for the CPU figure")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    sent: dict[str, float] = {}
    waits: list[float] = []
    got = trio.Event()

    def on_notify(payload: str) -> None:
        if payload in sent:
            waits.append(time.perf_counter() - sent[payload])
            got.set()

    sender = psycopg.connect(args.dsn, autocommit=True)
    try:
        async with (
            open_database(args.dsn, min_size=1, max_size=2, name="autom-bench-listen") as db,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(db.listen, "autom_bench_wake", on_notify)
            for i in range(args.n):
                got = trio.Event()
                sent[str(i)] = time.perf_counter()
                sender.execute("select pg_notify('autom_bench_wake', %s)", [str(i)])  # blocks the loop briefly
                with trio.fail_after(5):
                    await got.wait()
                await trio.sleep(args.gap_ms / 1000)
            cpu0 = cpu_seconds()
            await trio.sleep(args.idle)
            idle_cpu = cpu_seconds() - cpu0
            nursery.cancel_scope.cancel()
    finally:
        sender.close()
    ms = sorted(w * 1000 for w in waits)
    print(json.dumps({
        "label": args.label, "n": len(ms), "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3), "max_ms": round(ms[-1], 3),
        "idle_cpu_ms_per_s": round(idle_cpu / args.idle * 1000, 2),
    }), flush=True)


if __name__ == "__main__":
    trio.run(main)
