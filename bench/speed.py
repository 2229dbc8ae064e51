"""The speed figures in one command, each beside its baseline and its floor, several rounds interleaved.

    python bench/speed.py [--runs 3] [--quick] [--out DIR] [--base-src DIR] [--only worker,floor,reply,intake]
    python bench/speed.py report DIR            the table again from a run's folder

Run it with the project's venv (``.venv/bin/python bench/speed.py``) on a machine with
PostgreSQL (``AUTOM_BENCH_ADMIN_DSN``, default ``postgresql://postgres@127.0.0.1:5432/postgres``)
and ``wrk``. Each round runs, one after the other:

1. **worker**: ``bench/run_worker_bench.sh`` with RUNS=1 (its rep = this round):
   autom's drain of N_JOBS no-op jobs in both lanes (``bench/drain.py``: no recipient,
   1,000 recipients), autom's idle enqueue → start latency (``bench/latency.py``, both
   lanes), then PGQueuer's drain and latency (``../shared/bench-peers``, its venv
   made by its ``setup_venv.sh`` when missing);
2. **floor**: ``bench/floor.py``: the least a service with autom's guarantees does
   here, in plain psycopg (idle enqueue → start; webhook → reply on a bare h11 server
   on trio), with the same gaps and samples: the idle and reply goals are ratios to it
   (idle p50 and p99 ≤ 1.3×, reply p50 ≤ 1.5×), met when every round's ratio is (the
   drain's "≥ 2× PGQueuer" too: each round's autom ÷ that round's PGQueuer);
3. **reply**: ``bench/reply.py``: an idle ``autom run`` answers signed ``/ping``
   updates one at a time; POST → the Telegram stub received ``sendMessage``; the
   same process's RSS after start and after a burst; then again (no burst) in a
   database where ``--drained`` (20,000) no-op jobs were drained first;
4. **intake**: ``bench/intake.py --levels 16``: wrk's 16 senders against the
   intake and against the same server's no-database route (a wrong secret: 401),
   alternating.

Before the first round, ``--warmup`` (1) uncounted runs of the worker part (both autom and
PGQueuer, into ``warmup-N/``, not in the table), so that a cold machine's first minute is
nobody's round: in round six the first round was autom's lowest in every run; in round
seven PGQueuer's warm-up drain was its lowest (1.5k against 3.2–3.4k) while autom's
first counted recipients drain was still its lowest (bench/RESULTS.md, "Speed round seven").

With ``--base-src DIR`` (a checkout of older code, e.g. ``git worktree add /tmp/base
main``) every part also runs that code (``PYTHONPATH=DIR``, rows "autom base")
right after this checkout's, and the table adds the ratio to it.

The 1-minute load average is sampled every second; the table gives its mean and
maximum per round. Everything lands in ``--out`` (a new folder: one holding an earlier
run's records is refused; default ``$TMPDIR/autom-speed-<time>``): each part's JSON lines and logs, ``table.md``.
At the defaults (3 rounds) the whole run takes about 7 minutes on 2 cores (about 14
with ``--base-src``); ``--quick`` (one short round) about 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from drain import base_checkout, collect, fmt, load, med  # noqa: E402 (bench/ is not a package)

PARTS = ("worker", "floor", "reply", "intake")
#: issue 27's goals: idle p50 and p99 at most 1.3× the floor's, webhook → reply p50 at most 1.5×
IDLE_FLOOR_LIMIT = 1.3
REPLY_FLOOR_LIMIT = 1.5


# --- the table ----------------------------------------------------------------------------


@dataclass
class Figure:
    """One row: this checkout's values (one a round), its baseline's, and the issue's target."""

    name: str
    values: list[float]
    baseline: str = "-"
    baseline_values: list[float] | None = None
    #: the target: ("ratio_min", 2.0) = at least 2× the baseline; ("ratio_max", 1.5); ("max", 3.0) = at most 3
    target: tuple[str, float] | None = None
    base_values: list[float] | None = None  # --base-src's values
    unit: str = ""
    #: bench/floor.py's figure of the same rounds (one a round) and the goal: at most ``floor_limit`` × it
    floor_values: list[float] | None = None
    floor_limit: float | None = None

    def median(self) -> float | None:
        return med(list(self.values))

    def ratio(self) -> float | None:
        a, b = self.median(), med(list(self.baseline_values or []))
        return a / b if a is not None and b else None

    def round_ratios(self) -> list[float]:
        """autom ÷ baseline of each round (the two lists pair by round: both ran in each), else []."""
        base = list(self.baseline_values or [])
        if len(base) < 2 or len(base) != len(self.values) or not all(base):
            return []
        return [a / b for a, b in zip(self.values, base, strict=True)]

    def base_ratio(self) -> float | None:
        a, b = self.median(), med(list(self.base_values or []))
        return a / b if a is not None and b else None

    def floor_ratios(self) -> list[float]:
        """autom ÷ floor of each round (the two lists pair by round), else of the medians."""
        floor = [v for v in self.floor_values or [] if v]
        if floor and len(floor) == len(self.values):
            return [a / b for a, b in zip(self.values, floor, strict=True)]
        a, b = self.median(), med(list(floor))
        return [a / b] if a is not None and b else []

    def target_text(self) -> str:
        if self.floor_limit is not None:
            return f"≤ {self.floor_limit:g}× floor"
        if self.target is None:
            return "-"
        kind, limit = self.target
        return {"ratio_min": f"≥ {limit:g}× baseline", "ratio_max": f"≤ {limit:g}× baseline",
                "max": f"≤ {limit:g}{self.unit}"}[kind]

    def verdict(self) -> str:
        if self.floor_limit is not None:
            ratios = self.floor_ratios()
            if not ratios:
                return "no data"
            # every round's ratio within the goal; the machine's load is beside the table
            return "**met**" if max(ratios) <= self.floor_limit else "missed"
        if self.target is None:
            return "-"
        kind, limit = self.target
        value = self.median() if kind == "max" else self.ratio()
        if value is None:
            return "no data"
        if kind == "ratio_min" and self.round_ratios():
            # issue 27: "≥ 2× PGQueuer in every round", not only the medians'
            value = min(self.round_ratios())
        met = value >= limit if kind == "ratio_min" else value <= limit
        return "**met**" if met else "missed"


def number(v: float) -> str:
    """A figure as the tables show it: rates with k, milliseconds with one or two decimals."""
    if v >= 1000:
        return fmt(v)
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def spread(values: list[float] | None) -> str:
    """median (min–max), or the one value, or "-"."""
    vals = [v for v in values or [] if v is not None]
    if not vals:
        return "-"
    m = statistics.median(vals)
    return number(m) if len(vals) == 1 else f"{number(m)} ({number(min(vals))}–{number(max(vals))})"


def of(recs: list[dict[str, Any]], test: str, key: str, variant: str | None = None,
       where: Callable[[dict[str, Any]], bool] = lambda r: True) -> list[float]:
    """``key`` of every autom record of ``test`` (and ``variant``) that ``where`` accepts, in file order."""
    return [r[key] for r in recs if r.get("system") == "autom" and r.get("test") == test
            and r.get("variant") == variant and where(r) and r.get(key) is not None]


def floor_of(recs: list[dict[str, Any]], test: str, key: str) -> list[float]:
    """``key`` of bench/floor.py's ``test`` records (idle, reply), in file order (one a round)."""
    return [r[key] for r in recs if r.get("system") == "floor" and r.get("test") == test and r.get(key) is not None]


def figures(worker_recs: list[dict[str, Any]], speed_recs: list[dict[str, Any]]) -> list[Figure]:
    """The table's rows from the worker bench's records (drain.py, latency.py, the peers')
    and the reply/rss/intake records of the rounds."""
    rows = collect(worker_recs)
    pgq = rows.get("pgqueuer", {})
    out: list[Figure] = []
    lanes = (("no recipient", "autom, jobs without recipient"),
             ("1,000 recipients", "autom, jobs over 1,000 recipients"))
    for lane, row in lanes:
        out.append(Figure(
            f"drain, {lane} (jobs/s, worker start → stopped)", rows.get(row, {}).get("sts", []),
            "PGQueuer", pgq.get("sts", []), ("ratio_min", 2.0),
            rows.get(row.replace("autom,", "autom base,"), {}).get("sts")))
    for key in ("p50", "p99"):
        for lane, row in lanes:
            lane_name = "with a recipient" if "1,000" in lane else lane
            out.append(Figure(
                f"idle enqueue → start {key}, {lane_name} (ms)", rows.get(row, {}).get(key, []),
                "PGQueuer", pgq.get(key, []), None,
                rows.get(row.replace("autom,", "autom base,"), {}).get(key), " ms",
                floor_values=floor_of(speed_recs, "idle", f"{key}_ms"), floor_limit=IDLE_FLOOR_LIMIT))
    for drained, when in ((False, "fresh database"), (True, "after a 20,000-job drain")):
        def where(r: dict[str, Any], drained: bool = drained) -> bool:
            return bool(r.get("drained")) == drained

        for key, limit in (("p50_ms", REPLY_FLOOR_LIMIT), ("p99_ms", None)):
            out.append(Figure(
                f"webhook → reply {key[:3]}, idle, {when} (ms)", of(speed_recs, "reply", key, where=where),
                base_values=of(speed_recs, "reply", key, "base", where) or None, unit=" ms",
                floor_values=floor_of(speed_recs, "reply", key), floor_limit=limit))

    def route(name: str) -> Callable[[dict[str, Any]], bool]:
        return lambda r: r.get("route") == name and r.get("senders") == 16

    # the sender's answer: p50/p90/p99/max (issue 26: a long tail hid behind a good p50)
    for label, key, target in (("rate (webhooks/s)", "rate", None), ("p50 (ms)", "p50_ms", None),
                               ("p90 (ms)", "p90_ms", None), ("p99 (ms)", "p99_ms", ("ratio_max", 1.5)),
                               ("max (ms)", "max_ms", None),
                               ("server CPU per request (ms)", "cpu_ms_per_request", ("max", 0.55))):
        out.append(Figure(
            f"intake, 16 senders: {label}", of(speed_recs, "intake", key, where=route("intake")),
            "no-database route", of(speed_recs, "intake", key, where=route("nodb")), target,
            of(speed_recs, "intake", key, "base", route("intake")) or None, " ms" if "ms" in key else ""))
    def fresh(r: dict[str, Any]) -> bool:
        return not r.get("drained")

    for label, key in (("after start", "start_mb"), ("after a burst", "after_burst_mb")):
        out.append(Figure(
            f"idle RSS of autom run, {label} (MB)", of(speed_recs, "rss", key, where=fresh), target=("max", 80.0),
            base_values=of(speed_recs, "rss", key, "base", fresh) or None, unit=" MB"))
    return out


def table(figs: list[Figure], rounds: list[dict[str, Any]]) -> str:
    """The markdown table, and the load per round under it."""
    with_base = any(f.base_values for f in figs)
    with_floor = any(f.floor_values for f in figs)
    head = "| figure | autom: median (min–max) | baseline | baseline: median (min–max) | autom ÷ baseline |"
    head += " autom base | autom ÷ base |" if with_base else ""
    head += " floor: median (min–max) | autom ÷ floor, per round |" if with_floor else ""
    head += " target | met |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for f in figs:
        if not f.values and not f.base_values and not f.baseline_values:
            continue  # a part that was not run (--only); a failed one shows in the load line
        ratio = f.ratio()
        per_round = f.round_ratios() if f.target is not None and f.target[0] == "ratio_min" else []
        cells = [f.name, spread(f.values), f.baseline, spread(f.baseline_values),
                 ("-" if ratio is None else f"{ratio:.2f}×")
                 + (f" (rounds: {', '.join(f'{r:.2f}×' for r in per_round)})" if per_round else "")]
        if with_base:
            base_ratio = f.base_ratio()
            cells += [spread(f.base_values), "-" if base_ratio is None else f"{base_ratio:.2f}×"]
        if with_floor:
            ratios = f.floor_ratios() if f.floor_values else []
            cells += [spread(f.floor_values), ", ".join(f"{r:.2f}×" for r in ratios) or "-"]
        cells += [f.target_text(), f.verdict()]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Median (min–max) over the rounds. The floor (bench/floor.py) ran in the same rounds; a floor "
                 "goal is met when every round's ratio is within it.")
    lines.append("1-minute load per round (mean, max of 1-second samples; 2 cores shared): " + ", ".join(
        f"round {r['round']}: {r['load_mean']:.2f}, {r['load_max']:.2f}"
        + (f" ({', '.join(r['failed'])} failed)" if r.get("failed") else "") for r in rounds))
    return "\n".join(lines)


def reply_parts(speed_recs: list[dict[str, Any]]) -> str:
    """Where webhook → reply's time goes: the p50 of each part, median over the rounds (autom fresh,
    autom after the drain, the floor)."""
    names = {"answered": "202 read by the sender", "stored": "event stored (intake transaction began)",
             "claimed": "job claimed (claim transaction began)", "claim_to_reply": "claimed → stub got sendMessage"}
    out = []
    for label, test in (("autom, fresh", lambda r: r.get("system") == "autom" and not r.get("drained")),
                        ("autom, after the drain", lambda r: r.get("system") == "autom" and r.get("drained")),
                        ("floor", lambda r: r.get("system") == "floor")):
        recs = [r for r in speed_recs if r.get("test") == "reply" and r.get("variant") is None and test(r)]
        if recs:
            parts = ", ".join(f"{names[k]} {statistics.median(r['parts_p50_ms'][k] for r in recs):.2f} ms"
                              for k in names)
            out.append(f"webhook → reply, p50 from the POST (median of the rounds), {label}: {parts}")
    return "\n".join(out)


def report(folder: Path) -> str:
    """The table of a run's folder (worker-N/ from run_worker_bench.sh, speed.jsonl, rounds.jsonl)."""
    worker_recs = [r for p in sorted(folder.glob("worker-*/autom.jsonl")) for r in load(str(p))]
    worker_recs += [r for p in sorted(folder.glob("worker-*/peers-*/results.jsonl")) for r in load(str(p))]
    speed_path, rounds_path = folder / "speed.jsonl", folder / "rounds.jsonl"
    speed_recs = load(str(speed_path)) if speed_path.exists() else []
    rounds = load(str(rounds_path)) if rounds_path.exists() else []
    text = table(figures(worker_recs, speed_recs), rounds)
    parts = reply_parts(speed_recs)
    details = (f"Details in {folder}: worker-N/table.md (drain.py's table of round N), reply-N.log, "
               "intake-N.log; all rounds' worker table: bench/drain.py report worker-*/autom.jsonl "
               "worker-*/peers-*/results.jsonl")
    return text + ("\n" + parts if parts else "") + "\n" + details


# --- the run ------------------------------------------------------------------------------


class LoadSampler:
    """The 1-minute load average once a second, in a thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), os.getloadavg()[0]))
            self._stop.wait(1.0)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[float]:
        return [load for t, load in self.samples if start <= t <= end] or [os.getloadavg()[0]]


def step(name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> bool:
    """Run one part; its stdout and stderr go to ``log_path``; False (and the log's end shown) if it failed."""
    started = time.monotonic()
    with log_path.open("w") as log_file:
        proc = subprocess.run(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=HERE.parent)
    took = time.monotonic() - started
    summary = [ln for ln in log_path.read_text().splitlines()
               if ln.startswith(("autom ", "floor ", "drained ", "pgqueuer drain", "  intake", "  nodb"))]
    print(f"   {name}: {took:.0f}s" + "".join(f"\n     {ln.strip()}" for ln in summary), file=sys.stderr, flush=True)
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-15:])
        print(f"   {name} FAILED (exit {proc.returncode}), see {log_path}:\n{tail}", file=sys.stderr, flush=True)
    return proc.returncode == 0


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    py = sys.executable
    env = {**os.environ, "N_JOBS": str(args.jobs), "WORKERS": str(args.workers), "LAT_N": str(args.lat_n),
           "LAT_GAP_MS": str(args.gap_ms), "AUTOM_PY": py}
    base_env = None
    if args.base_src:
        base = base_checkout(args.base_src)
        base_env = {**env, "PYTHONPATH": f"{base}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH")
                    else str(base)}
    speed = str(out / "speed.jsonl")
    reply = [py, str(HERE / "reply.py"), "--n", str(args.reply_n), "--gap-ms", str(args.gap_ms),
             "--burst", str(args.burst), "--out", speed]
    drained = [py, str(HERE / "reply.py"), "--n", str(args.reply_n), "--gap-ms", str(args.gap_ms),
               "--burst", "0", "--drained", str(args.drained), "--out", speed]
    floor = [py, str(HERE / "floor.py"), "--n", str(args.lat_n), "--gap-ms", str(args.gap_ms), "--out", speed]
    intake = [py, str(HERE / "intake.py"), "--levels", "16", "--rounds", str(args.intake_rounds),
              "--duration", str(args.intake_seconds), "--out", speed]
    t0 = time.monotonic()
    if "worker" in parts:
        for n in range(1, args.warmup + 1):  # uncounted: see the module docstring
            print(f"== warm-up {n}/{args.warmup}, not counted (load {os.getloadavg()[0]:.2f}) ==",
                  file=sys.stderr, flush=True)
            step("worker warm-up (drain both lanes, idle latency, PGQueuer)",
                 ["bash", str(HERE / "run_worker_bench.sh")],
                 {**env, "RUNS": "1", "FIRST_REP": "1", "OTHER_PEERS": "", "FAIRNESS": "0",
                  "OUT": str(out / f"warmup-{n}")}, out / f"warmup-{n}.log")
    with LoadSampler() as sampler:
        for n in range(1, args.runs + 1):
            started, failed = time.time(), []
            print(f"== round {n}/{args.runs} (load {os.getloadavg()[0]:.2f}) ==", file=sys.stderr, flush=True)
            if "worker" in parts:
                worker_env = {**env, "RUNS": "1", "FIRST_REP": str(n), "OTHER_PEERS": "", "FAIRNESS": "0",
                              "OUT": str(out / f"worker-{n}")}
                if args.base_src:
                    worker_env["BASE_SRC"] = str(Path(args.base_src).resolve())
                if not step("worker (drain both lanes, idle latency, PGQueuer)",
                            ["bash", str(HERE / "run_worker_bench.sh")], worker_env, out / f"worker-{n}.log"):
                    failed.append("worker")
            if "floor" in parts and not step("floor (idle, reply)", floor, env, out / f"floor-{n}.log"):
                failed.append("floor")
            for name, cmd in (("reply", reply), ("reply-drained", drained), ("intake", intake)):
                if name.split("-")[0] not in parts or (name == "reply-drained" and not args.drained):
                    continue
                if not step(name, cmd, env, out / f"{name}-{n}.log"):
                    failed.append(name)
                if base_env is not None and not step(f"{name} (base)", [*cmd, "--variant", "base"], base_env,
                                                     out / f"{name}-base-{n}.log"):
                    failed.append(f"{name} base")
            loads = sampler.between(started, time.time())
            with (out / "rounds.jsonl").open("a") as f:
                f.write(json.dumps({"round": n, "started": started, "secs": time.time() - started,
                                    "load_mean": statistics.fmean(loads), "load_max": max(loads),
                                    "failed": failed}) + "\n")
    text = report(out)
    (out / "table.md").write_text(text + "\n")
    print(f"\ntotal {time.monotonic() - t0:.0f}s; everything in {out}\n", file=sys.stderr, flush=True)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        if len(argv) != 2:
            print("usage: bench/speed.py report DIR", file=sys.stderr)
            return 2
        print(report(Path(argv[1])))
        return 0
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=int(env("RUNS", "3")), help="rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=int(env("WARMUP", "1")),
                        help="uncounted runs of the worker part before the first round (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="one short round: 5,000 jobs, 50 latency and reply samples, 2 s intake runs")
    parser.add_argument("--jobs", type=int, default=int(env("N_JOBS", "20000")), help="jobs per drain")
    parser.add_argument("--workers", type=int, default=int(env("WORKERS", "16")),
                        help="drain/latency workers, and PGQueuer's concurrency")
    parser.add_argument("--lat-n", type=int, default=int(env("LAT_N", "200")), help="idle latency samples per lane")
    parser.add_argument("--gap-ms", type=float, default=float(env("LAT_GAP_MS", "50")),
                        help="mean idle gap between two samples (latency and reply)")
    parser.add_argument("--reply-n", type=int, default=int(env("REPLY_N", "200")), help="webhook → reply samples")
    parser.add_argument("--burst", type=int, default=int(env("REPLY_BURST", "2000")),
                        help="updates in the burst before the second RSS reading")
    parser.add_argument("--drained", type=int, default=int(env("REPLY_DRAINED", "20000")),
                        help="webhook → reply also after this many jobs were drained in its database (0: not)")
    parser.add_argument("--intake-seconds", type=float, default=float(env("INTAKE_SECONDS", "4")),
                        help="seconds of each wrk run (no-DB, then intake)")
    parser.add_argument("--intake-rounds", type=int, default=int(env("INTAKE_ROUNDS", "1")),
                        help="alternating no-DB/intake wrk runs per round")
    parser.add_argument("--only", default=",".join(PARTS), help="the parts to run (worker,floor,reply,intake)")
    parser.add_argument("--base-src", default=env("BASE_SRC"),
                        help="a checkout of older autom code to run beside this one (rows 'autom base')")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.jobs, args.lat_n, args.reply_n, args.burst, args.intake_seconds = 1, 5000, 50, 50, 500, 2.0
        args.warmup = 0
    unknown = set(args.only.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"--only: unknown parts {sorted(unknown)}")
    if args.out is None:
        args.out = Path(os.environ.get("TMPDIR", "/tmp")) / f"autom-speed-{time.strftime('%Y%m%d-%H%M%S')}"
    elif (args.out / "speed.jsonl").exists() or (args.out / "rounds.jsonl").exists():
        # the report pairs each round's records in file order: a second run (or one still
        # going) writing into the same folder mixes its rounds into this one's ratios
        parser.error(f"--out {args.out} holds an earlier run's records: give a new folder")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
