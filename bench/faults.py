"""Fault rounds for the guarantees of "Side effects once": real processes, real PostgreSQL, counted effects.

    python bench/faults.py                        20 rounds of each outage case, 5 of the others
    python bench/faults.py --rounds 20 --only restart freeze --seconds 7
    python bench/faults.py --rounds 20 --only intake
    options: [--jobs 10] [--json FILE]

Each round runs one scenario of tests/support/once_faults.py (the tests run each once):
``follow_up`` (a handler fails after its once block, which enqueued a follow-up),
``restart`` / ``freeze`` (PostgreSQL stopped, or SIGSTOPped, for ``--seconds`` while every
block is inside its effect) and ``shared`` (two jobs share each key, on two replicas).
It prints, per scenario, the rounds in which every key had exactly one effect, one
follow-up job and one follow-up run, and the totals of repeated effects, keys off
(an effect, follow-up row or run not exactly once), the most effects of one key in
flight at once, and attempts. The machine's PostgreSQL (AUTOM_TEST_DATABASE_URL, else an
embedded one) hosts the databases of follow_up and shared; restart and freeze use a
throwaway embedded server each round.

``intake`` (tests/support/intake_freeze.py): eight senders keep delivering Telegram
updates while a throwaway server is SIGSTOPped for 15 s (past the 10 s deadline), then,
on another, for 4 s; it prints the deliveries, 202s, 503s, what was stored, the 503s
stored all the same (the README's exception: begun before the server stopped), the
slowest answer, and whether every update was stored exactly once after the senders
retried their 503s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import intake_freeze, once_faults
from tests.support.restartable_pg import restartable_pg

SCENARIOS = ("follow_up", "restart", "freeze", "shared", "intake")


async def one_round(name: str, folder: Path, seconds: float, jobs: int, dsn: str | None) -> once_faults.Counts:
    if name in ("restart", "freeze"):
        with restartable_pg() as pg:
            return await once_faults.outage(folder, pg, name, seconds, jobs=jobs)
    assert dsn is not None
    if name == "follow_up":
        return await once_faults.follow_up(folder, dsn, jobs=jobs)
    return await once_faults.shared_keys(folder, dsn, pairs=jobs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each scenario (default 20 outage, 5 other)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--seconds", type=float, default=7.0, help="how long the database is away (restart, freeze)")
    parser.add_argument("--jobs", type=int, default=10, help="keys per round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from autom.db.migrate import apply_migrations_sync
    from autom.db.scratch import start_pg_server, temporary_database

    results: dict[str, list[dict[str, object]]] = {}
    server = start_pg_server()
    try:
        for name in args.only:
            rounds = args.rounds or (20 if name in ("restart", "freeze", "intake") else 5)
            results[name] = []
            for number in range(1, rounds + 1):
                began = time.monotonic()
                if name == "intake":
                    results[name].extend(intake_rows(number, rounds, trio.run(intake_freeze.freeze_rounds)))
                    continue
                with temporary_database(server) as dsn, tempfile.TemporaryDirectory() as folder:
                    if name in ("follow_up", "shared"):
                        import psycopg
                        with psycopg.connect(dsn, autocommit=True) as conn:
                            apply_migrations_sync(conn)
                    counts = trio.run(one_round, name, Path(folder), args.seconds, args.jobs, dsn)
                row = {"round": number, "ok": counts.ok(), "repeated_effects": counts.repeated_effects,
                       "keys_off": counts.missing, "attempts": counts.attempts, "summary": counts.summary(),
                       "seconds": round(time.monotonic() - began, 1)}
                results[name].append(row)
                print(f"{name} {number}/{rounds}: {'ok' if counts.ok() else 'NOT OK'}: {counts.summary()}", flush=True)
    finally:
        server.close()
    if any(name != "intake" for name in results):
        print()
        print("| scenario | rounds all-once | repeated effects | keys off | attempts |")
        print("| --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        if name == "intake":
            continue
        print(f"| {name} | {sum(1 for r in rows if r['ok'])}/{len(rows)} | "
              f"{sum(int(str(r['repeated_effects'])) for r in rows)} | {sum(int(str(r['keys_off'])) for r in rows)} | "
              f"{sum(int(str(r['attempts'])) for r in rows)} |")
    if results.get("intake"):
        print_intake(results["intake"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def intake_rows(number: int, rounds: int, done: list[intake_freeze.Round]) -> list[dict[str, object]]:
    """One row per freeze of an intake round, printed as it comes."""
    rows = []
    for result in done:
        row = {"round": number, "ok": not result.problems, **result.counts()}
        print(f"intake {number}/{rounds} freeze {result.freeze_seconds:g} s: "
              f"{'ok' if row['ok'] else 'NOT OK'}: {json.dumps(result.counts())}", flush=True)
        for problem in result.problems[:5]:
            print(f"  {problem}", flush=True)
        rows.append(row)
    return rows


def print_intake(rows: list[dict[str, object]]) -> None:
    """The intake rounds' totals per freeze length."""
    print()
    print("| freeze | rounds ok | deliveries | 202 | 503 | stored | 503 stored (exception) | retries duplicate "
          "| slowest answer s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for seconds in sorted({float(str(r["freeze_s"])) for r in rows}, reverse=True):
        mine = [r for r in rows if float(str(r["freeze_s"])) == seconds]

        def total(key: str, of: list[dict[str, object]] = mine) -> int:
            return sum(int(str(r[key])) for r in of)

        slowest = max(float(str(r["max_answer_s"])) for r in mine)
        print(f"| {seconds:g} s | {sum(1 for r in mine if r['ok'])}/{len(mine)} | {total('deliveries')} | "
              f"{total('202')} | {total('503')} | {total('stored')} | {total('503_stored')} | "
              f"{total('retry_duplicates')} | {slowest:.2f} |")


if __name__ == "__main__":
    main()
