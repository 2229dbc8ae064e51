"""Worker benchmark: how fast autom's worker pool drains a backlog of no-op jobs.

    python bench/drain.py [--jobs 20000] [--workers 16] [--batch N] [--chunk 1000]
                          [--recipients 0,1000,1000+0,0+1000] [--runs 1] [--fairness] [--out FILE]
    python bench/drain.py report AUTOM.jsonl [PEERS.jsonl]    the combined table
    python bench/drain.py worker ...                           (internal) the worker process

What one run does, per variant (``--recipients``: 0 = jobs without a recipient,
1000 = jobs spread round-robin over 1,000 recipients; a mixed backlog, ``A+B``: ``--jobs``
jobs of kind A enqueued first (so older), then ``--jobs`` of kind B, 2 × ``--jobs`` in
all, e.g. ``1000+0`` = recipient jobs older than the recipient-less ones, labelled
``1000+none``):

1. creates a fresh database on ``--admin-dsn`` (default: the local PostgreSQL 15)
   and applies the migrations (once per invocation; dropped at the end);
2. resets it as the peers' benchmark does (``truncate``, then ``vacuum analyze``);
3. enqueues ``--jobs`` no-op jobs (kind ``noop``) with ``JobStore.enqueue_many`` in
   calls of ``--chunk`` through autom's trio bridge, timed;
4. starts the worker in its own process (this file with ``worker``): the real
   service composition, ``autom.service.run_service`` (pool of WORKERS + 8
   connections, LISTEN, ticker without schedules, HTTP on 127.0.0.1:0, Telegram
   in log-only mode) with LOG_LEVEL=warning and the handler
   ``async def noop(ctx, job)`` registered as ``noop`` (``--handler tx5``: it first
   writes five rows, each in its own ``ctx.transaction()`` block, committed with the job). The handler counts its
   calls; at the N-th it asks the service to stop, which stops claiming, lets the
   completer record the last completions and returns;
5. verifies in SQL that exactly N jobs are ``done`` and none is in any other state.

Each drain record also has what the worker's statements read from the two due-time
indexes of jobs (``idx_scan``, ``idx_tup_read`` of ``jobs_due_free`` and ``jobs_due_all``
in ``pg_stat_user_indexes``, from before the worker starts to after it exited): the
recipient-less lane's walk (the claim's ``nc``) is the only statement of a drain that
reads them.

Two bench-local subclasses are swapped into ``autom.service`` in the worker process
(autom's code is not changed): ``WorkerPool`` to take ``--batch`` (when given; else
its default) and to note
when the pool starts and stops, ``JobStore`` to count and time the claim and
complete statements (two ``perf_counter`` calls per statement).

Timings (all in the worker, ``perf_counter``):

- **drain** = pool start (``WorkerPool.run`` entered) to pool stopped (the fetcher
  has stopped and the completer has recorded every completion): the headline;
- **start to stopped** = before ``run_service`` to after it returned (opening the
  pool, the migrations check, HTTP bind, shutdown): the peers' "worker start to
  stopped" column;
- **span** = first to last handler call: the peers' "1st to last handler" column.

``--fairness`` adds the fairness figure: 10,000 jobs for recipient ``big``, then one
for ``small``, drained with the same pool; it reports how many claim statements,
jobs claimed and jobs recorded done came before ``small``'s job started, and the
same with the 10,000 jobs enqueued without a recipient.

CPU per job: the worker process (all its threads), this database's PostgreSQL
backends (``/proc/<pid>/stat``, the server runs on the same machine), and the whole
machine's busy CPU (``/proc/stat``, as the peers measure it).

A worker that crashes is recorded as a failed run (``verified: false``, its error,
its stderr kept beside ``--out``) and the runs go on; "job finished but its lease
was lost" warnings are counted.

Experiment knobs (records carry them and ``report`` leaves them out):
``--workers``/``--batch``, ``--dsn-options=--synchronous_commit=off`` (the worker's
connections only), ``--pool-kwargs '{"prefetch": 34}'`` (extra WorkerPool arguments,
for a patched copy of autom put first on ``PYTHONPATH``), ``--setup-sql`` (run once
after the migrations), ``--phase exp-...``, ``--py-spy PREFIX``.

The planner's statistics: each run resets the table as the peers do (``truncate``, then
``vacuum analyze`` of the empty table), so the worker's statements are planned with
statistics of an empty table. ``--analyze`` analyzes the backlog after the enqueue (the
planner knows it); ``--history N`` puts N finished jobs in the table and analyzes it
before the backlog comes (a long-running service's statistics: nearly every job
finished, due_at NULL). ``report`` shows these on rows of their own.

Every result is one JSON line (stdout and ``--out``); ``report`` turns them and the
peers' ``results.jsonl`` (bench-peers/run_all.sh) into one markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ADMIN_DSN = os.environ.get("AUTOM_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


# --- shared helpers (latency.py imports these) ------------------------------------------


def emit(rec: dict[str, Any], out: str | None) -> None:
    """Print one JSON line, and append it to ``out`` when given."""
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine_busy() -> float:
    """CPU-seconds every process on this machine has spent busy (/proc/stat), as the peers measure it."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user + nice + system + irq + softirq (idle, iowait and steal left out)
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100), as peers/common.py computes it."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def versions() -> dict[str, str]:
    """The versions that matter for the worker benchmark."""
    out = {"python": platform.python_version()}
    for name in ("autom", "trio", "psycopg", "psycopg-pool", "trio-util"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "?"
    return out


def machine() -> str:
    """CPU model and count, memory, kernel."""
    text = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in text if ln.startswith("model name")), platform.processor())
    mem_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal")))
    return f"{os.cpu_count()} × {model}, {mem_kb / 1024 / 1024:.0f} GiB RAM, {platform.system()} {platform.release()}"


def env_record(admin_dsn: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        server = conn.execute("select version()").fetchone()[0].split(" on ")[0]  # type: ignore[index]
    return {"system": "autom", "test": "env", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(), "postgres": server, "load_1min": os.getloadavg()[0], **versions()}


def base_checkout(path: str | Path) -> Path:
    """A checkout of other code to run beside this one (``--base-src``), resolved, migrating with
    its own files: one with a top-level ``migrations/`` gets the link ``autom/migrations`` to it
    (PYTHONPATH's ``autom`` comes before the editable install's, and so does its migrations
    package through the link)."""
    base = Path(path).resolve()
    if not (base / "autom" / "migrations").exists() and (base / "migrations").is_dir():
        (base / "autom" / "migrations").symlink_to("../migrations")
    return base


@contextmanager
def bench_database(admin_dsn: str, prefix: str, keep: bool = False):
    """A fresh, migrated database for the block; yields its dsn."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from autom.db.migrate import apply_migrations_sync

    name = f"autom_{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    dsn = make_conninfo(admin_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply_migrations_sync(conn)
        yield dsn
    finally:
        if not keep:
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(f'drop database if exists "{name}" with (force)')


def with_options(dsn: str, options: str | None) -> str:
    """``dsn`` with extra server options (``-c synchronous_commit=off``) for experiments."""
    if not options:
        return dsn
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    old = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{old} {options}".strip())


def bench_settings(dsn: str, workers: int) -> Any:
    """Settings for a service under benchmark: the defaults, LOG_LEVEL=warning, no Telegram."""
    from autom.config import Settings

    return Settings(database_url=dsn, workers=workers, host="127.0.0.1", port=0, log_format="json",
                    log_level="warning", shutdown_grace_seconds=5.0)


def composition_root() -> Any:
    """The module composing the service: ``autom.service``, or ``autom.app`` in an older checkout (--variant base)."""
    import importlib

    try:
        return importlib.import_module("autom.service")
    except ImportError:  # before the rename, autom/app.py was the composition root
        return importlib.import_module("autom.app")


def install_probes(batch: int | None, pool_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Swap bench-local subclasses of WorkerPool and JobStore into ``autom.service`` (worker process only).

    Returns the dict they fill: pool start/stop times, claim and complete statements
    (count, rows, seconds in the call), and the ``on_claim(jobs, t0, t1)`` hook
    (``perf_counter`` before and after the claim call).
    """
    from autom.jobs.store import JobStore
    from autom.worker import WorkerPool

    probe: dict[str, Any] = {
        "pool_start": None, "pool_end": None,
        "claims": 0, "claimed": 0, "claim_s": 0.0, "empty_claims": 0,
        "completes": 0, "completed": 0, "complete_s": 0.0,
        "on_claim": None,
    }
    now = time.perf_counter

    class ProbeStore(JobStore):
        async def claim(self, n: int = 1, **kwargs: Any) -> list[Any]:  # durable= (not in an older autom)
            t0 = now()
            jobs = await super().claim(n, **kwargs)
            t1 = now()
            probe["claim_s"] += t1 - t0
            probe["claims"] += 1
            probe["claimed"] += len(jobs)
            probe["empty_claims"] += not jobs
            if probe["on_claim"] is not None:
                probe["on_claim"](jobs, t0, t1)
            return jobs

        if hasattr(JobStore, "write"):  # the one outcome writer: "done" outcomes counted
            async def write(self, outcomes: Any, **kwargs: Any) -> Any:
                t0 = now()
                written, more = await super().write(outcomes, **kwargs)  # type: ignore[misc]
                if outcomes and outcomes[0].status == "done":  # the completer writes "done" apart
                    probe["complete_s"] += now() - t0
                    probe["completes"] += 1
                    probe["completed"] += len(written)
                return written, more
        elif hasattr(JobStore, "complete_batch"):  # the completer's statement (complete_many calls it too)
            async def complete_batch(self, jobs: Any, **kwargs: Any) -> tuple[set[int], bool]:
                t0 = now()
                held, more = await super().complete_batch(jobs, **kwargs)  # type: ignore[misc]
                probe["complete_s"] += now() - t0
                probe["completes"] += 1
                probe["completed"] += len(held)
                return held, more
        else:  # an older autom (--variant base through PYTHONPATH)
            async def complete_many(self, jobs: Any) -> set[int]:
                t0 = now()
                held = await super().complete_many(jobs)
                probe["complete_s"] += now() - t0
                probe["completes"] += 1
                probe["completed"] += len(held)
                return held

    class ProbePool(WorkerPool):
        def __init__(self, deps: Any, handlers: Any, **kwargs: Any) -> None:
            if batch is not None:
                kwargs.setdefault("batch", batch)
            kwargs.update(pool_kwargs or {})
            super().__init__(deps, handlers, **kwargs)

        async def run(self, *, task_status: Any = None) -> None:
            import trio

            if probe.get("backends_cpu") is not None:
                probe["pg_cpu_start"] = probe["backends_cpu"]()
            probe["pool_start"] = now()
            try:
                await super().run(task_status=task_status or trio.TASK_STATUS_IGNORED)
            finally:
                probe["pool_end"] = now()
                if probe.get("backends_cpu") is not None:
                    probe["pg_cpu_end"] = probe["backends_cpu"]()

    root = composition_root()
    root.JobStore = ProbeStore
    root.WorkerPool = ProbePool
    return probe


# --- the worker process ----------------------------------------------------------------


def backends_cpu_reader(dsn: str) -> Any:
    """A function returning {pid: CPU seconds} of the PostgreSQL backends of this database (other
    than its own connection), read from /proc: the server works on the same machine here."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> dict[int, float]:
        pids = [r[0] for r in conn.execute(
            "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()")]
        out = {}
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
        return out

    return read


def pg_cpu_seconds(start: dict[int, float] | None, end: dict[int, float] | None) -> float | None:
    """CPU the database's backends used between two readings (a backend that appeared counts in full)."""
    if start is None or end is None:
        return None
    return sum(cpu - start.get(pid, 0.0) for pid, cpu in end.items())



@dataclass
class Clock:
    """Handler-side bookkeeping."""

    n: int
    count: int = 0
    first: float | None = None
    last: float | None = None
    small: dict[str, Any] | None = None


def worker(args: argparse.Namespace) -> None:
    """Drain ``--jobs`` jobs with the service, then print one JSON line of timings."""
    import trio

    from autom.logs import configure_logging

    configure_logging("json", "warning")
    root = composition_root()
    Control, run_service = root.Control, root.run_service
    probe = install_probes(args.batch, json.loads(args.pool_kwargs) if args.pool_kwargs else None)
    clock = Clock(args.jobs)
    control = Control()

    def on_claim(jobs: list[Any], t0: float, t1: float) -> None:
        if clock.small is None and any(j.recipient == "small" for j in jobs):
            clock.small = {"claims_before": probe["claims"] - 1, "claimed_before": probe["claimed"] - len(jobs),
                           "claimed_with": len(jobs), "completed_at_claim": probe["completed"]}

    probe["on_claim"] = on_claim
    try:
        probe["backends_cpu"] = backends_cpu_reader(args.dsn)
    except Exception as exc:  # no /proc, or the server is elsewhere: leave the figure out
        log(f"worker: no PostgreSQL backend CPU figure: {exc}")

    async def noop(ctx: Any, job: Any) -> None:
        if args.handler == "tx5":  # five ctx.transaction() blocks of one insert each, committed with the job
            for i in range(5):
                async with ctx.transaction() as tx:
                    await tx.execute("insert into bench_notes (job_id, n) values (%s, %s)", [job.id, i])
        t = time.perf_counter()
        if clock.first is None:
            clock.first = t
        clock.last = t
        if job.recipient == "small" and clock.small is not None and "started_before" not in clock.small:
            clock.small.update(started_before=clock.count, completed_before=probe["completed"],
                               secs_after_pool_start=t - probe["pool_start"])
        clock.count += 1
        if clock.count >= clock.n:
            control.request_stop()

    settings = bench_settings(args.dsn, args.workers)

    async def main() -> dict[str, Any]:
        t_start = time.perf_counter()
        cpu0, busy0 = time.process_time(), machine_busy()
        with trio.move_on_after(args.timeout) as scope:
            await run_service(settings, control=control, handlers={"noop": noop}, schedules=(),
                              binds=["127.0.0.1:0"], telegram_log_only=True)
        if scope.cancelled_caught:
            log(f"worker: timed out after {args.timeout} s with {clock.count} jobs handled")
        t_end = time.perf_counter()
        cpu1, busy1 = time.process_time(), machine_busy()
        # CPU from before run_service to after it (the peers' span); imports are outside
        return {
            "handled": clock.count, "timed_out": scope.cancelled_caught,
            "start_to_stopped_s": t_end - t_start,
            "drain_s": probe["pool_end"] - probe["pool_start"],
            "startup_s": probe["pool_start"] - t_start,
            "span_s": (clock.last - clock.first) if clock.first is not None and clock.last is not None else None,
            "first_handler_after_s": (clock.first - probe["pool_start"]) if clock.first is not None else None,
            "worker_cpu_s": cpu1 - cpu0, "machine_busy_s": busy1 - busy0,
            "pg_cpu_s": pg_cpu_seconds(probe.get("pg_cpu_start"), probe.get("pg_cpu_end")),
            "claims": probe["claims"], "claimed": probe["claimed"], "claim_s": probe["claim_s"],
            "empty_claims": probe["empty_claims"],
            "completes": probe["completes"], "completed": probe["completed"], "complete_s": probe["complete_s"],
            "small": clock.small,
        }

    print(json.dumps(trio.run(main)), flush=True)


# --- the driver ------------------------------------------------------------------------


def reset(dsn: str) -> None:
    """Empty the queue and refresh statistics (the peers reset the same way)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("truncate jobs, recipients, events restart identity cascade")
        conn.execute("vacuum analyze jobs")
        conn.execute("vacuum analyze recipients")


def enqueue(dsn: str, groups: list[tuple[int, Any]], chunk: int) -> float:
    """Enqueue ``groups`` = [(count, recipient_of(i))...] in order with enqueue_many; returns seconds.

    Only the enqueue_many calls are timed (not opening the pool).
    """
    import trio

    from autom.db import open_database
    from autom.jobs.models import NewJob
    from autom.jobs.store import JobStore

    async def main() -> float:
        async with open_database(dsn, min_size=1, max_size=2, name="autom-bench-enqueue") as db:
            store = JobStore(db)
            batches = []
            for count, recipient_of in groups:
                jobs = [NewJob(kind="noop", recipient=recipient_of(i)) for i in range(count)]
                batches += [jobs[i:i + chunk] for i in range(0, count, chunk)]
            t0 = time.perf_counter()
            created = 0
            for batch in batches:
                created += len(await store.enqueue_many(batch))
            secs = time.perf_counter() - t0
            assert created == sum(c for c, _ in groups), created
            return secs

    return trio.run(main)


def run_worker(dsn: str, args: argparse.Namespace, jobs: int, tag: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--dsn", with_options(dsn, args.dsn_options),
           "--jobs", str(jobs),
           "--workers", str(args.workers), "--timeout", str(args.timeout)]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    if args.pool_kwargs:
        cmd += ["--pool-kwargs", args.pool_kwargs]
    if args.variant:
        cmd += ["--variant", args.variant]
    cmd += ["--handler", getattr(args, "handler", "noop")]  # speed.py passes its own arguments
    if args.py_spy:  # PREFIX → PREFIX-<tag>.svg (flame graph) or, PREFIX ending in .txt, collapsed stacks
        raw = args.py_spy.endswith(".txt")
        out = f"{args.py_spy.removesuffix('.txt')}-{tag}.{'txt' if raw else 'svg'}"
        cmd = ["py-spy", "record", "--rate", "250", "--threads", "--format", "raw" if raw else "flamegraph",
               "-o", out, "--", *cmd]
    if getattr(args, "cprofile", None):  # PREFIX → PREFIX-<tag>.prof: deterministic call counts, whatever the load
        cmd = [cmd[0], "-m", "cProfile", "-o", f"{args.cprofile}-{tag}.prof", *cmd[1:]]
    env = {**os.environ, "LOG_LEVEL": "warning"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout + 60)
    # the service's own warnings: "lease was lost" ones are counted, the rest shown
    lost = [ln for ln in proc.stderr.splitlines() if "lease was lost" in ln]
    rest = "\n".join(ln for ln in proc.stderr.splitlines() if "lease was lost" not in ln).strip()
    if lost:
        log(f"worker: {len(lost)} 'job finished but its lease was lost' warnings")
    if rest:
        log(rest[-20000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        # the worker crashed: report it as a failed run (verified=false), keep its stderr, and go on
        saved = f"{args.out or os.path.join(tempfile.gettempdir(), 'autom-drain')}.{tag}.stderr"
        Path(saved).write_text(proc.stderr)
        errors = [m.group(0) for ln in rest.splitlines()
                  if (m := re.match(r"[\w.]+(Error|Exception|Detected|Violation)\b.*", ln.strip(" |+-")))]
        return {"failed": True, "returncode": proc.returncode, "error": (errors or ["?"])[-1][:300],
                "stderr": saved, "lease_lost_warnings": len(lost)}
    return {**json.loads(lines[-1]), "lease_lost_warnings": len(lost)}


def analyze(dsn: str) -> None:
    """Statistics of the backlog (--analyze): the planner then knows the due jobs and the mix of lanes."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("analyze jobs")
        conn.execute("analyze recipients")


def status_counts(dsn: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("select status, count(*) from jobs group by status").fetchall())  # type: ignore[arg-type]


def index_reads(dsn: str) -> dict[str, int]:
    """idx_scan and idx_tup_read of the two due-time indexes (pg_stat_user_indexes)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select pg_stat_clear_snapshot()")
        rows = conn.execute("select indexrelname, idx_scan, idx_tup_read from pg_stat_user_indexes"
                            " where indexrelname in ('jobs_due_free', 'jobs_due_all')").fetchall()
        # the database's transactions and the row writes per table: counts, not times, so a
        # loaded machine does not blur them (two versions' drains compare statement for statement)
        xacts = conn.execute("select xact_commit + xact_rollback from pg_stat_database"
                             " where datname = current_database()").fetchone()
        writes = conn.execute("select relname, n_tup_ins + n_tup_upd + n_tup_del from pg_stat_user_tables"
                              " where relname in ('jobs', 'recipients', 'worker_starts', 'job_attempts')").fetchall()
    counts = {f"{k}_{name}": int(v) for name, scans, reads in rows for k, v in (("scans", scans), ("reads", reads))}
    counts["xacts"] = int(xacts[0]) if xacts else 0
    counts.update({f"writes_{name}": int(n) for name, n in writes})
    return counts


def variant_groups(variant: str, n: int) -> tuple[str, list[tuple[int, Any]]]:
    """A --recipients variant's label and enqueue groups: "0" (none), "1000", or "A+B" (A's n jobs, then B's)."""
    def group(recipients: int) -> tuple[int, Any]:
        return (n, (lambda i: f"r{i % recipients}") if recipients else (lambda i: None))

    parts = [int(x) for x in variant.split("+")]
    return "+".join(str(p) if p else "none" for p in parts), [group(p) for p in parts]


def add_history(dsn: str, n: int) -> None:
    """--history: n finished jobs (done, a quarter with a recipient), then analyze: statistics as
    a long-running service's table has them (nearly every job finished: due_at NULL), before a burst."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("insert into jobs (kind, recipient, status, run_at, finished_at)"
                     " select 'noop', case when i %% 4 = 0 then 'h' || (i %% 1000) end, 'done',"
                     " now() - interval '1 day', now() - interval '1 day' from generate_series(1, %s) i", (n,))
        conn.execute("vacuum analyze jobs")


def drain_run(dsn: str, args: argparse.Namespace, variant: str, rep: int) -> None:
    reset(dsn)
    if args.history:
        add_history(dsn, args.history)
    label, groups = variant_groups(variant, args.jobs)
    n = sum(c for c, _ in groups)
    enq_s = enqueue(dsn, groups, args.chunk)
    if args.analyze:
        analyze(dsn)
    emit({"system": "autom", "test": "enqueue_batch", "recipients": label, "rep": rep, "jobs": n,
          "chunk": args.chunk, "secs": enq_s, "jobs_per_s": n / enq_s, "phase": args.phase,
          "variant": args.variant, "analyzed": args.analyze, "history": args.history}, args.out)
    reads0 = index_reads(dsn)
    w = run_worker(dsn, args, n, f"drain-{label}-{rep}")
    counts = status_counts(dsn)
    reads1 = index_reads(dsn)
    reads = {k: reads1[k] - reads0.get(k, 0) for k in reads1}
    if w.get("failed"):
        emit({"system": "autom", "test": "drain", "recipients": label, "rep": rep, "jobs": n, "workers": args.workers,
              "batch": args.batch, "phase": args.phase, "pool_kwargs": args.pool_kwargs, "variant": args.variant,
              "dsn_options": args.dsn_options, "verified": False, "status_counts": counts, **w}, args.out)
        log(f"autom drain ({label} recipients) rep {rep}: the worker FAILED: {w['error']}")
        return
    verified = counts == {"done": n + args.history} and w["handled"] == n
    rec = {
        "system": "autom", "test": "drain", "recipients": label, "rep": rep, "jobs": n, "variant": args.variant,
        "workers": args.workers, "batch": args.batch, "dsn_options": args.dsn_options, "py_spy": bool(args.py_spy),
        "pool_kwargs": args.pool_kwargs, "phase": args.phase, "setup_sql": args.setup_sql,
        "handler": getattr(args, "handler", "noop"),
        "analyzed": args.analyze, "history": args.history,
        "jobs_per_s": n / w["drain_s"], "start_to_stopped_jobs_per_s": n / w["start_to_stopped_s"],
        "span_jobs_per_s": (n / w["span_s"]) if w["span_s"] else None,
        "worker_cpu_us_per_job": w["worker_cpu_s"] / n * 1e6,
        "machine_cpu_us_per_job": w["machine_busy_s"] / n * 1e6,
        "pg_cpu_us_per_job": (w["pg_cpu_s"] / n * 1e6) if w.get("pg_cpu_s") is not None else None,
        "jobs_per_claim": w["claimed"] / max(1, w["claims"] - w["empty_claims"]),
        "jobs_per_complete": w["completed"] / max(1, w["completes"]),
        "claim_ms_avg": 1000 * w["claim_s"] / max(1, w["claims"]),
        "complete_ms_avg": 1000 * w["complete_s"] / max(1, w["completes"]),
        "status_counts": counts, "verified": verified, "index_reads": reads,
        **{f"w_{k}": v for k, v in w.items() if k != "small"},
    }
    emit(rec, args.out)
    log(f"autom{' ' + args.variant if args.variant else ''} drain ({label} recipients) rep {rep}: "
        f"{rec['jobs_per_s']:.0f} jobs/s "
        f"(enqueue {n / enq_s:.0f}/s; {w['claims']} claims of {rec['jobs_per_claim']:.1f}, "
        f"{w['completes']} completes of {rec['jobs_per_complete']:.1f}; "
        f"due-index entries read: free {reads.get('reads_jobs_due_free')}, all {reads.get('reads_jobs_due_all')}; "
        f"per 1,000 jobs: {1000 * reads.get('xacts', 0) / n:.0f} transactions, row writes "
        + ", ".join(f"{k.removeprefix('writes_')} {1000 * v / n:.0f}" for k, v in sorted(reads.items())
                    if k.startswith("writes_"))
        + f"; verified={verified})")


def fairness_run(dsn: str, args: argparse.Namespace, big_recipient: str | None) -> None:
    big = args.fair_backlog
    reset(dsn)
    enqueue(dsn, [(big, lambda i: big_recipient), (1, lambda i: "small")], args.chunk)
    w = run_worker(dsn, args, big + 1, f"fair-{big_recipient}")
    counts = status_counts(dsn)
    if w.get("failed"):
        emit({"system": "autom", "test": "fairness", "backlog": big, "backlog_recipient": big_recipient,
              "verified": False, "status_counts": counts, **w}, args.out)
        log(f"autom fairness (backlog recipient {big_recipient}): the worker FAILED: {w['error']}")
        return
    small = w["small"] or {}
    rec = {
        "system": "autom", "test": "fairness", "backlog": big, "backlog_recipient": big_recipient,
        "workers": args.workers, "batch": args.batch, "variant": args.variant, **small,
        "drain_s": w["drain_s"], "jobs_per_s": w["handled"] / w["drain_s"], "handled": w["handled"],
        "timed_out": w["timed_out"], "status_counts": counts,
        "verified": counts == {"done": big + 1} and w["handled"] == big + 1,
    }
    emit(rec, args.out)
    log(f"autom fairness (backlog recipient {big_recipient}): small started after {small.get('started_before')} "
        f"handler starts, {small.get('claims_before')} claim statements, {small.get('completed_before')} done; "
        f"backlog drained at {rec['jobs_per_s']:.0f} jobs/s")


def drive(args: argparse.Namespace) -> int:
    emit(env_record(args.admin_dsn), args.out)
    variants = [x.strip() for x in args.recipients.split(",") if x.strip()]
    with bench_database(args.admin_dsn, "bench_worker", keep=args.keep_db) as dsn:
        if getattr(args, "handler", "noop") == "tx5":
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("create table if not exists bench_notes (job_id bigint, n int)")
        if args.setup_sql:  # experiments only (e.g. dropping an index); recorded in every drain record
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(args.setup_sql)
        # warm-up: one small drain, so the first measured run does not pay for cold caches
        if not args.no_warmup:
            reset(dsn)
            enqueue(dsn, [(2000, lambda i: None)], args.chunk)
            run_worker(dsn, args, 2000, "warmup")  # (a failure here shows in the log; the runs go on)
        for rep in range(args.first_rep, args.first_rep + args.runs):  # rep 1 of every variant, then rep 2...
            for recipients in variants:
                drain_run(dsn, args, recipients, rep)
        if args.fairness:
            fairness_run(dsn, args, "big")
            fairness_run(dsn, args, None)
    return 0


# --- the combined report -----------------------------------------------------------------


def load(path: str) -> list[dict[str, Any]]:
    recs = []
    with open(path) as f:
        for line in f:
            if line.strip().startswith("{"):
                recs.append(json.loads(line))
    return recs


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 10000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}"


def cell(values: list[float | None], f: Any = fmt) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    m = statistics.median(vals)
    return f(m) if len(vals) == 1 else f"{f(m)} ({f(min(vals))}–{f(max(vals))})"


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


#: report's rows for autom's records, by their ``recipients`` label (latency.py's "recipient" = drain's "1000")
AUTOM_ROWS = {"none": "autom, jobs without recipient", "1000": "autom, jobs over 1,000 recipients",
              "recipient": "autom, jobs over 1,000 recipients",
              "1000+none": "autom, mixed: recipient jobs older than recipient-less ones",
              "none+1000": "autom, mixed: recipient-less jobs older than recipient ones"}
PEERS = ("pgqueuer", "procrastinate", "raw", "oban")


def collect(recs: list[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """The figures of the report, by row (``AUTOM_ROWS``' names, "autom <variant>, ...", the peers')
    and key (drain, sts, span, wcpu, mcpu, pgcpu, enq, p50, p99): one value per run.

    Experiments (py-spy, dsn options, pool kwargs, setup SQL, phase "exp...") and failed runs are left out.
    """
    rows: dict[str, dict[str, list[Any]]] = {}
    autom_rows, peers = AUTOM_ROWS, PEERS

    def row_name(r: dict[str, Any]) -> str:
        name = autom_rows[r["recipients"]] + (" (analyzed backlog)" if r.get("analyzed") else "") \
            + (f" (after {r['history']} finished jobs)" if r.get("history") else "")
        return name.replace("autom,", f"autom {r['variant']},", 1) if r.get("variant") else name

    def add(name: str, key: str, value: Any) -> None:
        rows.setdefault(name, {}).setdefault(key, []).append(value)

    for r in recs:
        sysname, test = r.get("system"), r.get("test")
        if sysname == "autom" and test == "drain" and r.get("verified") and not r.get("py_spy") \
                and not r.get("dsn_options") and not r.get("pool_kwargs") and not r.get("setup_sql") \
                and not (r.get("phase") or "").startswith("exp") and r["recipients"] in autom_rows:
            name = row_name(r)
            add(name, "drain", r["jobs_per_s"])
            add(name, "sts", r["start_to_stopped_jobs_per_s"])
            add(name, "span", r["span_jobs_per_s"])
            add(name, "wcpu", r["worker_cpu_us_per_job"])
            add(name, "mcpu", r["machine_cpu_us_per_job"])
            add(name, "pgcpu", r.get("pg_cpu_us_per_job"))
        elif sysname == "autom" and test == "enqueue_batch" and r["recipients"] in autom_rows \
                and not (r.get("phase") or "").startswith("exp"):
            add(row_name(r), "enq", r["jobs_per_s"])
        elif sysname == "autom" and test == "latency" and r["recipients"] in autom_rows:
            add(row_name(r), "p50", r["p50_ms"])
            add(row_name(r), "p99", r["p99_ms"])
        elif sysname in peers and test == "drain" and r.get("verified"):
            add(sysname, "drain", r["jobs_per_s"])
            add(sysname, "sts", r["jobs_per_s"])  # the peers' drain is worker start → stopped
            add(sysname, "span", r.get("span_jobs_per_s"))
            add(sysname, "wcpu", r.get("worker_cpu_us_per_job"))
            add(sysname, "mcpu", r.get("machine_cpu_us_per_job"))
        elif sysname in peers and test == "enqueue_batch":
            add(sysname, "enq", r["jobs_per_s"])
        elif sysname in peers and test == "latency":
            add(sysname, "p50", r["p50_ms"])
            add(sysname, "p99", r["p99_ms"])
    return rows


def report(paths: list[str]) -> int:
    """One markdown table: autom's drain/latency beside the peers of the same run, ratio to PGQueuer."""
    recs = [r for p in paths for r in load(p)]
    rows = collect(recs)
    peers = PEERS

    def limit(test: str) -> list[float | None]:
        return [r["jobs_per_s"] for r in recs if r.get("system") == "limit" and r.get("test") == test
                and r.get("clients") == 16 and r.get("sync") == "on" and r.get("valid", True)]

    def ms(v: float) -> str:
        return f"{v:.1f}"

    pgq = rows.get("pgqueuer", {})
    print("| system | enqueue batch (1000/call) jobs/s | drain jobs/s: pool start → stopped | "
          "worker start → stopped | 1st → last handler | drain × PGQueuer | "
          "worker CPU µs/job | PostgreSQL backends CPU µs/job | machine CPU µs/job | latency p50 ms | latency p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    order = [n for n in rows if n.startswith("autom ") or n.startswith("autom,")]
    order = sorted(order, key=lambda n: (n.split(",")[0] != "autom", n.split(",")[0], "1,000" in n))
    order += [p for p in peers if p in rows]
    for name in order:
        r = rows[name]
        d, base = med(r.get("sts", [])), med(pgq.get("sts", []))
        ratio = f"{d / base:.2f}×" if d and base else "-"
        pool_start = cell(r.get("drain", [])) if name.startswith("autom") else "-"
        print(f"| {name} | {cell(r.get('enq', []))} | {pool_start} | {cell(r.get('sts', []))} | "
              f"{cell(r.get('span', []))} | {ratio} | {cell(r.get('wcpu', []))} | {cell(r.get('pgcpu', []))} | "
              f"{cell(r.get('mcpu', []))} | "
              f"{cell(r.get('p50', []), ms)} | {cell(r.get('p99', []), ms)} |")
    if limit("claim_one") or limit("claim_batch"):
        print(f"| limit (pgbench, 16 clients, sync on) | | | claim-1: {cell(limit('claim_one'))}, "
              f"claim-50: {cell(limit('claim_batch'))} | | | | | | | |")
    print()
    print("Figures: median (min–max) over the runs. \"drain × PGQueuer\" compares worker start → stopped, "
          "the peers' own drain figure.")
    for name in order:
        if not name.startswith("autom"):
            continue
        r = rows[name]
        parts = []
        for key, label in (("sts", "drain (worker start → stopped)"), ("drain", "drain (pool start → stopped)"),
                           ("span", "1st → last handler")):
            a, b = med(r.get(key, [])), med(pgq.get("sts" if key == "drain" else key, []))
            if a and b:
                parts.append(f"{label} {a / b:.2f}×")
        for key in ("p50", "p99"):
            a, b = med(r.get(key, [])), med(pgq.get(key, []))
            if a and b:
                parts.append(f"latency {key} {a / b:.2f}×")
        if parts:
            print(f"- {name} / PGQueuer: " + ", ".join(parts))
        base_name = next((n for n in order if n != name and n.startswith("autom base,")
                          and n.split(",", 1)[1] == name.split(",", 1)[1]), None)
        if base_name and not name.startswith("autom base,"):
            b = rows[base_name]
            bits = []
            for key, label in (("sts", "drain (worker start → stopped)"), ("drain", "drain (pool start → stopped)")):
                x, y = med(r.get(key, [])), med(b.get(key, []))
                if x and y:
                    bits.append(f"{label} {x / y:.2f}×")
            for key in ("p50", "p99"):
                x, y = med(r.get(key, [])), med(b.get(key, []))
                if x and y:
                    bits.append(f"latency {key} {x:.1f} ms against {y:.1f} ms")
            if bits:
                print(f"- {name} / {base_name}: " + ", ".join(bits))
    runs = [r for r in recs if r.get("system") == "autom" and r.get("test") in ("drain", "fairness")
            and not (r.get("phase") or "").startswith("exp")]
    failed = [r for r in runs if r.get("failed")]
    lost = sum(r.get("lease_lost_warnings") or r.get("w_lease_lost_warnings") or 0 for r in runs)
    print(f"- autom worker runs: {len(runs)}, crashed: {len(failed)}"
          + "".join(f"; {r['test']} rep {r.get('rep', '')}: {r['error']}" for r in failed)
          + f"; 'lease was lost' warnings for jobs that were done: {lost}")
    for r in recs:
        if r.get("system") == "autom" and r.get("test") == "fairness" and not r.get("failed"):
            who = "recipient 'big'" if r["backlog_recipient"] else "jobs without recipient"
            if r.get("variant"):
                who += f" (autom {r['variant']})"
            after_ms = (r.get("secs_after_pool_start") or 0) * 1000
            print(f"- fairness, {r['backlog']}-job backlog of {who}: 'small' was claimed by claim statement "
                  f"#{(r.get('claims_before') or 0) + 1} after {r.get('claimed_before')} jobs were claimed; "
                  f"its handler started after {r.get('started_before')} other handler starts, with "
                  f"{r.get('completed_before')} jobs recorded done, {after_ms:.0f} ms after pool start; "
                  f"the whole backlog drained at {r['jobs_per_s']:.0f} jobs/s (verified={r['verified']})")
    return 0


# --- command line ------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        return report(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", nargs="?", default="drive", choices=["drive", "worker"])
    parser.add_argument("--admin-dsn", default=ADMIN_DSN)
    parser.add_argument("--dsn", help="(worker) the database")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("N_JOBS", "20000")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "16")))
    parser.add_argument("--batch", type=int, default=None,
                        help="WorkerPool(batch=...): most jobs per claim (default: WorkerPool's own)")
    parser.add_argument("--chunk", type=int, default=1000, help="jobs per enqueue_many call")
    parser.add_argument("--recipients", default="0,1000",
                        help="variants: 0 = no recipient, N = N recipients, A+B = a mixed backlog (A's jobs older)")
    parser.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "1")))
    parser.add_argument("--first-rep", type=int, default=1, help="label of the first repetition")
    parser.add_argument("--fairness", action="store_true", help="add the fairness figure")
    parser.add_argument("--fair-backlog", type=int, default=10000)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a worker may run")
    parser.add_argument("--dsn-options", default=None,
                        help="experiments: server options for the worker only, e.g. '-c synchronous_commit=off'")
    parser.add_argument("--py-spy", default=None,
                        help="profile each worker with py-spy: PREFIX-<run>.svg (collapsed stacks: PREFIX.txt)")
    parser.add_argument("--cprofile", default=None,
                        help="run each worker under cProfile: PREFIX-<run>.prof (call counts per job do not depend on "
                             "the machine's load; times do)")
    parser.add_argument("--pool-kwargs", default=None,
                        help="experiments: more WorkerPool keyword arguments as JSON (for a patched copy of autom)")
    parser.add_argument("--phase", default=None, help="a label stored with each drain record")
    parser.add_argument("--variant", default=None,
                        help="which autom this is (e.g. 'base' for an older checkout put first on PYTHONPATH); "
                             "report shows each variant on its own rows")
    parser.add_argument("--setup-sql", default=None, help="experiments: SQL run once after the migrations")
    parser.add_argument("--analyze", action="store_true",
                        help="analyze jobs and recipients after the enqueue: the planner knows the backlog "
                             "(without it, as the peers' reset: statistics of the empty table)")
    parser.add_argument("--history", type=int, default=0,
                        help="N finished jobs in the table, analyzed, before each run's backlog (a long-running "
                             "service's statistics: nearly every job finished)")
    parser.add_argument("--handler", choices=["noop", "tx5"], default="noop",
                        help="the jobs' handler: noop, or tx5 (five ctx.transaction() blocks of one insert each)")
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.path.append(str(HERE.parent))  # after PYTHONPATH, so a patched copy of autom can be tried
    sys.exit(main())
