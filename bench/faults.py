"""Fault rounds for the guarantees of "Side effects once": real processes, real PostgreSQL, counted effects.

    python bench/faults.py                        20 rounds of each outage case, 5 of the others
    python bench/faults.py --rounds 20 --only restart freeze --seconds 7
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

from tests.support import once_faults
from tests.support.restartable_pg import restartable_pg

SCENARIOS = ("follow_up", "restart", "freeze", "shared")


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
            rounds = args.rounds or (20 if name in ("restart", "freeze") else 5)
            results[name] = []
            for number in range(1, rounds + 1):
                began = time.monotonic()
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
    print()
    print("| scenario | rounds all-once | repeated effects | keys off | attempts |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        print(f"| {name} | {sum(1 for r in rows if r['ok'])}/{len(rows)} | "
              f"{sum(int(str(r['repeated_effects'])) for r in rows)} | {sum(int(str(r['keys_off'])) for r in rows)} | "
              f"{sum(int(str(r['attempts'])) for r in rows)} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
