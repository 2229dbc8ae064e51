"""Database calls per second through ``autom.db`` (``db.fetch_val``), at 1 and at N concurrent tasks.

A micro figure for the bridge: how many ``select 1`` (and a prepared
``select $1::int``) one process gets through ``Database.fetch_val``, with the
process's CPU per call. Run it against two checkouts in one session to compare
(``PYTHONPATH=/tmp/base python bench/db_calls.py`` for the base), interleaved:

    for i in 1 2 3; do
      PYTHONPATH=/tmp/base .venv/bin/python bench/db_calls.py --label base
      .venv/bin/python bench/db_calls.py --label new
    done

Prints one JSON line per (tasks, query): calls/s and process CPU µs per call.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import trio

from autom.db import open_database


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(dsn: str, tasks: int, seconds: float, query: str, params: list[int] | None, prepare: bool) -> dict:
    async with open_database(dsn, min_size=tasks, max_size=tasks, name="autom-bench-calls") as db:
        for _ in range(3 * tasks):  # warm every connection (and its prepared statement)
            await db.fetch_val(query, params, prepare=prepare)
        calls = 0
        stop = trio.current_time() + seconds

        async def one() -> None:
            nonlocal calls
            while trio.current_time() < stop:
                await db.fetch_val(query, params, prepare=prepare)
                calls += 1

        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(one)
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    return {"calls_per_s": round(calls / wall), "cpu_us_per_call": round(cpu / calls * 1e6, 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("AUTOM_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--tasks", default="1,16", help="comma-separated concurrency levels")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    for tasks in (int(t) for t in args.tasks.split(",")):
        for name, query, params, prepare in (
            ("select 1", "select 1", None, False),
            ("prepared", "select %s::int", [1], True),
        ):
            figures = await measure(args.dsn, tasks, args.seconds, query, params, prepare)
            print(json.dumps({"label": args.label, "tasks": tasks, "query": name, **figures}), flush=True)


if __name__ == "__main__":
    trio.run(main)
