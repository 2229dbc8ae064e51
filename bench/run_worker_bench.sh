#!/usr/bin/env bash
# The worker benchmark in one run, back to back on one PostgreSQL: autom's drain
# (bench/drain.py) and idle latency (bench/latency.py) and PGQueuer's
# (bench-peers/run_all.sh) interleaved, RUNS times (so drift on a shared machine
# hits both alike); then the fairness figure and the rest of the peers (the
# pgbench limit, procrastinate). Prints one table with the ratio autom / PGQueuer.
#
# usage: bench/run_worker_bench.sh
#
# Order: [autom drain, autom latency, peers "pgqueuer" (drain + latency)] rep i for i in 1..RUNS,
#        then autom fairness, then peers "$OTHER_PEERS" (RUNS repetitions).
#
# Knobs (environment): RUNS [3], FIRST_REP [1] (the first rep's number: bench/speed.py runs this
#   script once per round with RUNS=1; PostgreSQL's fsync probe runs in rep 1 only), N_JOBS [20000],
#   WORKERS [16] (autom WORKERS = the peers' CONCURRENCY), LAT_N [200], LAT_GAP_MS [50],
#   OTHER_PEERS ["limit procrastinate"],
#   PEERS_SRC [../shared/bench-peers beside the checkout] (copied to PEERS_DIR [/tmp/bench-peers] when
#   that does not exist; its venv BENCH_VENV [/tmp/bench/venv] is made with its
#   setup_venv.sh when missing), AUTOM_PY [.venv/bin/python of the checkout, else python3],
#   FAIRNESS [1], WAIT_QUIET [0] (wait up to this many seconds for a 1-min load below 1),
#   BASE_SRC [unset]: a checkout of an older autom (e.g. `git worktree add /tmp/base <rev>`); when
#   set, each rep also runs its drain and latency (PYTHONPATH=$BASE_SRC, rows "autom base") right
#   after autom's, and the table gives the ratio new / base. The checkout needs
#   `ln -s ../migrations $BASE_SRC/autom/migrations` so that it migrates with its own files.
#   FAIRNESS_BASE [0]: the fairness figure for the base too (slow: its 'big' backlog runs one at a time),
#   OUT [$TMPDIR/autom-worker-bench-<time>], PGHOST/PGPORT/PGUSER [127.0.0.1/5432/postgres].
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
RUNS=${RUNS:-3}
FIRST_REP=${FIRST_REP:-1}
LAST_REP=$((FIRST_REP + RUNS - 1))
export N_JOBS=${N_JOBS:-20000} WORKERS=${WORKERS:-16} LAT_N=${LAT_N:-200} LAT_GAP_MS=${LAT_GAP_MS:-50}
export AUTOM_BENCH_ADMIN_DSN=${AUTOM_BENCH_ADMIN_DSN:-postgresql://$PGUSER@$PGHOST:$PGPORT/postgres}
OTHER_PEERS=${OTHER_PEERS-"limit procrastinate"}  # OTHER_PEERS="" runs none
PEERS_SRC=${PEERS_SRC:-$(cd "$(dirname "$0")/../.." && pwd)/shared/bench-peers}
PEERS_DIR=${PEERS_DIR:-/tmp/bench-peers}
if [ -z "${AUTOM_PY:-}" ]; then
  repo=$(cd "$(dirname "$0")/.." && pwd)
  if [ -x "$repo/.venv/bin/python" ]; then AUTOM_PY="$repo/.venv/bin/python"; else AUTOM_PY=python3; fi
fi
OUT=${OUT:-${TMPDIR:-/tmp}/autom-worker-bench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
AUTOM=$OUT/autom.jsonl
: >"$AUTOM"

# -- the peers' environment first, so a failure shows before the long part ------------
if [ ! -d "$PEERS_DIR" ]; then
  cp -r "$PEERS_SRC" "$PEERS_DIR"
  chmod -R u+w "$PEERS_DIR"
fi
export BENCH_VENV=${BENCH_VENV:-${TMPDIR:-/tmp}/bench/venv}
if [ ! -x "$BENCH_VENV/bin/python" ]; then
  echo "== setting up the peers' venv ($PEERS_DIR/setup_venv.sh) ==" >&2
  "$PEERS_DIR/setup_venv.sh" >"$OUT/setup_venv.log" 2>&1 || {
    echo "setup_venv.sh failed, see $OUT/setup_venv.log" >&2; exit 1; }
fi

if [ "${WAIT_QUIET:-0}" -gt 0 ]; then
  echo "== waiting up to ${WAIT_QUIET}s for a 1-min load below 1 ==" >&2
  deadline=$(( $(date +%s) + WAIT_QUIET ))
  while [ "$(date +%s)" -lt "$deadline" ] && ! awk '{exit !($1 < 1.0)}' /proc/loadavg; do sleep 5; done
  awk '{exit !($1 < 1.0)}' /proc/loadavg || echo "   still busy (load $(cut -d' ' -f1 /proc/loadavg)): starting anyway" >&2
fi

# load average and other databases' active backends, every second, for the caveats
(
  while true; do
    n=$(psql -X -d postgres -Atc "select count(*) from pg_stat_activity where state = 'active' and datname is not null and datname not like 'autom_bench%' and datname not like 'bench_%' and pid <> pg_backend_pid()" 2>/dev/null || echo "?")
    echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg) $n"
    sleep 1
  done
) >"$OUT/noise.tsv" &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null || true' EXIT

T0=$(date +%s)
cd "$ROOT"
peers() {  # peers LABEL SYSTEMS RUNS FSYNC_PROBE: one run_all.sh into $OUT/peers-LABEL
  (cd "$PEERS_DIR" && SYSTEMS="$2" RUNS=$3 FSYNC_PROBE=$4 CONCURRENCY=$WORKERS BENCH_OUT="$OUT/peers-$1" \
     ./run_all.sh >"$OUT/peers-$1.md" 2>"$OUT/peers-$1.log") || { tail -20 "$OUT/peers-$1.log" >&2; exit 1; }
  "$AUTOM_PY" - "$OUT/peers-$1/results.jsonl" >&2 <<'PY' || true
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line) if line.startswith("{") else {}
    if r.get("test") == "drain":
        print(f"{r['system']} drain: {r['jobs_per_s']:.0f} jobs/s (verified={r['verified']})")
PY
}
autom_drain() {  # autom_drain LABEL REP [ARGS...]
  local label=$1 rep=$2; shift 2
  "$AUTOM_PY" bench/drain.py --jobs "$N_JOBS" --workers "$WORKERS" --runs 1 --first-rep "$rep" --out "$AUTOM" "$@" \
    >/dev/null 2>"$OUT/autom-drain-$label.log" || { tail -20 "$OUT/autom-drain-$label.log" >&2; exit 1; }
  grep -h '^autom ' "$OUT/autom-drain-$label.log" >&2 || true
}
autom_latency() {  # autom_latency LABEL [ARGS...]
  local label=$1; shift
  "$AUTOM_PY" bench/latency.py --n "$LAT_N" --gap-ms "$LAT_GAP_MS" --workers "$WORKERS" --out "$AUTOM" "$@" \
    >/dev/null 2>"$OUT/autom-latency-$label.log" || { tail -20 "$OUT/autom-latency-$label.log" >&2; exit 1; }
  grep '^autom ' "$OUT/autom-latency-$label.log" >&2 || true
}
base() {  # base COMMAND...: run with the older checkout first on the path
  PYTHONPATH="$BASE_SRC${PYTHONPATH:+:$PYTHONPATH}" "$@"
}

for rep in $(seq "$FIRST_REP" "$LAST_REP"); do
  echo "== rep $rep/$LAST_REP: autom drain ($N_JOBS jobs, WORKERS=$WORKERS) ==" >&2
  autom_drain "$rep" "$rep"
  echo "== rep $rep/$LAST_REP: autom latency ($LAT_N jobs, ~${LAT_GAP_MS} ms apart) ==" >&2
  autom_latency "$rep"
  if [ -n "${BASE_SRC:-}" ]; then
    echo "== rep $rep/$LAST_REP: autom base ($BASE_SRC): drain and latency ==" >&2
    base autom_drain "base-$rep" "$rep" --variant base
    base autom_latency "base-$rep" --variant base
  fi
  echo "== rep $rep/$LAST_REP: pgqueuer (drain, concurrency $WORKERS, and latency) ==" >&2
  peers "pgqueuer-$rep" pgqueuer 1 "$([ "$rep" = 1 ] && echo 1 || echo 0)"
done
if [ "${FAIRNESS:-1}" = 1 ]; then
  echo "== autom fairness ==" >&2
  autom_drain fairness 1 --recipients "" --fairness --no-warmup
  if [ -n "${BASE_SRC:-}" ] && [ "${FAIRNESS_BASE:-0}" = 1 ]; then
    base autom_drain fairness-base 1 --recipients "" --fairness --no-warmup --variant base
  fi
fi
if [ -n "$OTHER_PEERS" ]; then
  echo "== peers: $OTHER_PEERS (RUNS=$RUNS) ==" >&2
  peers other "$OTHER_PEERS" "$RUNS" 0
fi
kill $SAMPLER 2>/dev/null || true

echo "total $(( $(date +%s) - T0 ))s; raw results in $OUT" >&2
awk '{n++; l+=$2; if ($2>m) m=$2; if ($3!="0") busy++} END {printf "noise: %d one-second samples, mean 1-min load %.2f (max %.2f), %d samples with another database active\n", n, l/n, m, busy}' \
  "$OUT/noise.tsv" | tee "$OUT/noise-summary.txt" >&2
echo
"$AUTOM_PY" bench/drain.py report "$AUTOM" "$OUT"/peers-*/results.jsonl | tee "$OUT/table.md"
