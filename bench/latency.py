"""Worker benchmark, idle latency: enqueue → handler start through NOTIFY → LISTEN → doorbell.

    python bench/latency.py [--n 200] [--gap-ms 50] [--variants none,recipient] [--out FILE]
    python bench/latency.py worker ...     (internal) the idle service

The method is peers/common.py's (bench-peers), so the figures compare:

1. a fresh, migrated database (dropped at the end);
2. the worker in its own process (this file with ``worker``): the real service,
   ``autom.service.run_service`` with WORKERS=16, LOG_LEVEL=warning and a handler
   ``lat`` that records ``time.time() - payload["t0"]`` first thing; it prints
   ``READY`` once the service runs (LISTEN included), and the driver waits 1 s more
   so it settles into its idle wait;
3. the driver (another process) enqueues ``--n`` jobs one at a time with autom's
   ``JobStore.enqueue`` (the intake's path: one insert + ``pg_notify`` in one
   transaction, through the trio bridge), ``t0 = time.time()`` taken just before the
   call and put in the payload; it sleeps ``--gap-ms`` × uniform(0.5, 1.5) between
   jobs (``random.Random(42)``, the peers' seed), so the worker is idle when each
   job arrives;
4. p50 / p99 (nearest rank, as the peers) / min / max / mean over the ``--n`` jobs.

Both clocks are ``time.time()`` on the same machine, so they compare across the two
processes. The latency includes the enqueue call's own round trip and commit, as the
peers' does. To say where the time goes, each job's latency is also split, with
the worker's claim call timed by a bench-local ``JobStore`` subclass (see drain.py):

- **enqueue**: the enqueue call (thread hop, insert, notify, commit);
- **wake**: enqueue returned → the claim call that took the job began (NOTIFY
  delivery, the listener thread, ``trio.from_thread``, the doorbell, the fetcher);
- **claim**: the claim call (thread hop + the claim statement);
- **dispatch**: claim returned → handler start (``start_soon`` of the job's task).

Variants: ``none`` = jobs without a recipient; ``recipient`` = each job has a
recipient (``r0``..``r49`` in turn), so the claim goes through the fair lane.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))

from drain import (  # noqa: E402 (bench/ is not a package)
    ADMIN_DSN,
    bench_database,
    bench_settings,
    composition_root,
    emit,
    env_record,
    install_probes,
    log,
    pct,
)


def worker(args: argparse.Namespace) -> None:
    """Run the idle service until ``--n`` jobs were handled; print their timings as JSON."""
    import trio

    from autom.logs import configure_logging

    configure_logging("json", "warning")
    root = composition_root()
    Control, run_service = root.Control, root.run_service
    probe = install_probes(None)
    offset = time.time() - time.perf_counter()  # perf_counter → wall clock, for the claim times
    claims: dict[int, tuple[float, float]] = {}
    seen: dict[int, dict[str, float]] = {}
    control = Control()

    def on_claim(jobs: list[Any], t0: float, t1: float) -> None:
        for job in jobs:
            claims[job.id] = (t0 + offset, t1 + offset)

    probe["on_claim"] = on_claim

    async def lat(ctx: Any, job: Any) -> None:
        now = time.time()
        c0, c1 = claims.get(job.id, (now, now))
        seen[job.id] = {"t0": job.payload["t0"], "handler": now, "claim_start": c0, "claim_end": c1}
        if len(seen) >= args.n:
            control.request_stop()

    settings = bench_settings(args.dsn, args.workers)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_service(
                settings, control=control, handlers={"lat": lat}, schedules=(), binds=["127.0.0.1:0"],
                telegram_log_only=True, task_status=task_status))
            print("READY", flush=True)
            nursery.cancel_scope.deadline = trio.current_time() + args.timeout

    trio.run(main)
    print(json.dumps({"jobs": seen, "claims": probe["claims"], "empty_claims": probe["empty_claims"]}), flush=True)


def enqueue_spaced(dsn: str, n: int, gap_ms: float, variant: str) -> dict[int, tuple[float, float]]:
    """Enqueue ``n`` jobs one at a time, spaced; returns {job id: (t0, enqueue returned)} (wall clock)."""
    import trio

    from autom.db import open_database
    from autom.jobs.models import NewJob
    from autom.jobs.store import JobStore

    async def main() -> dict[int, tuple[float, float]]:
        out: dict[int, tuple[float, float]] = {}
        async with open_database(dsn, min_size=1, max_size=2, name="autom-bench-enqueue") as db:
            store = JobStore(db)
            rng = random.Random(42)
            for i in range(n):
                recipient = f"r{i % 50}" if variant == "recipient" else None
                t0 = time.time()
                job_id = await store.enqueue(NewJob(kind="lat", payload={"t0": t0}, recipient=recipient))
                out[job_id] = (t0, time.time())  # type: ignore[index]
                await trio.sleep(gap_ms / 1000 * rng.uniform(0.5, 1.5))
        return out

    return trio.run(main)


def summary(values_ms: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(values_ms), "p99_ms": pct(values_ms, 99), "min_ms": min(values_ms),
            "max_ms": max(values_ms), "mean_ms": statistics.fmean(values_ms)}


def run_variant(dsn: str, args: argparse.Namespace, variant: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("truncate jobs, recipients, events restart identity cascade")
        conn.execute("vacuum analyze jobs")
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--dsn", dsn, "--n", str(args.n),
           "--workers", str(args.workers), "--timeout", str(args.timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "LOG_LEVEL": "warning"})
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"worker did not start: {line!r}")
        time.sleep(1.0)  # let it settle into its idle wait (the peers do the same)
        sent = enqueue_spaced(dsn, args.n, args.gap_ms, variant)
        out, _ = proc.communicate(timeout=args.timeout + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    jobs = {int(k): v for k, v in result["jobs"].items()}
    missing = set(sent) - set(jobs)
    if missing:
        raise RuntimeError(f"{len(missing)} jobs were not handled")
    total, enq, wake, claim, dispatch = [], [], [], [], []
    for job_id, (t0, t_ret) in sent.items():
        j = jobs[job_id]
        assert j["t0"] == t0
        total.append(1000 * (j["handler"] - t0))
        enq.append(1000 * (t_ret - t0))
        wake.append(1000 * (j["claim_start"] - t_ret))
        claim.append(1000 * (j["claim_end"] - j["claim_start"]))
        dispatch.append(1000 * (j["handler"] - j["claim_end"]))
    rec = {"system": "autom", "test": "latency", "recipients": variant, "variant": args.variant,
           "n": len(total), "gap_ms": args.gap_ms,
           **summary(total),
           "parts_p50_ms": {"enqueue": statistics.median(enq), "wake": statistics.median(wake),
                            "claim": statistics.median(claim), "dispatch": statistics.median(dispatch)},
           "parts_p99_ms": {"enqueue": pct(enq, 99), "wake": pct(wake, 99), "claim": pct(claim, 99),
                            "dispatch": pct(dispatch, 99)},
           "claims": result["claims"], "empty_claims": result["empty_claims"]}
    emit(rec, args.out)
    p50, p99 = rec["parts_p50_ms"], rec["parts_p99_ms"]
    who = f"autom {args.variant}" if args.variant else "autom"
    log(f"{who} latency ({variant}): p50 {rec['p50_ms']:.2f} ms, p99 {rec['p99_ms']:.2f} ms "
        f"(min {rec['min_ms']:.2f}, max {rec['max_ms']:.2f}); p50 parts: enqueue {p50['enqueue']:.2f}, "
        f"wake {p50['wake']:.2f}, claim {p50['claim']:.2f}, dispatch {p50['dispatch']:.2f}; p99 parts: "
        f"enqueue {p99['enqueue']:.2f}, wake {p99['wake']:.2f}, claim {p99['claim']:.2f}, "
        f"dispatch {p99['dispatch']:.2f}; {result['claims']} claims")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", nargs="?", default="drive", choices=["drive", "worker"])
    parser.add_argument("--admin-dsn", default=ADMIN_DSN)
    parser.add_argument("--dsn", help="(worker) the database")
    parser.add_argument("--n", type=int, default=int(os.environ.get("LAT_N", "200")))
    parser.add_argument("--gap-ms", type=float, default=float(os.environ.get("LAT_GAP_MS", "50")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "16")))
    parser.add_argument("--variants", default="none,recipient")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--variant", default=None, help="which autom this is (see drain.py --variant)")
    parser.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return 0
    emit(env_record(args.admin_dsn), args.out)
    with bench_database(args.admin_dsn, "bench_latency", keep=args.keep_db) as dsn:
        for variant in args.variants.split(","):
            run_variant(dsn, args, variant.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
