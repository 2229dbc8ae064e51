"""The first ANALYZE of ``jobs`` and ``recipients``, before autovacuum gets to it.

In a fresh database under sustained load autovacuum had not analyzed either table
85 s in (bench/RESULTS.md, Issue 27's sustained run): statements prepared in the
first seconds kept generic plans made for empty tables and fresh plans had no column
statistics, so the admission counts seq-scanned all of jobs and ``retire_lines`` all
of recipients, once a second, and PostgreSQL's CPU climbed until answers took 21 s.

``first_analyze`` runs in every role (autom/service.py): one read of
pg_stat_user_tables every ``every`` seconds; a table never analyzed that holds more
than ``rows`` rows is analyzed once (which also invalidates the cached plans). Once
both tables have been analyzed (here, by hand or by autovacuum) it returns: nothing
more to do in this process. Replicas may each analyze a table once: harmless. A
failure is logged (once) and tried again at the next check; it never stops the caller.
"""

from __future__ import annotations

import logging

import trio

from autom.db.bridge import Database
from autom.db.queries import Q

log = logging.getLogger(__name__)

#: The tables watched, and the query analyzing each (the SQL lives in queries_stats.sql).
TABLES = {"jobs": Q.stats_analyze_jobs, "recipients": Q.stats_analyze_recipients}
#: Rows a never-analyzed table holds before it is analyzed (smaller ones plan fine either way).
MIN_ROWS = 1000
#: Seconds between two reads of pg_stat_user_tables while a table waits for its statistics.
CHECK_SECONDS = 5.0


async def analyze_unanalyzed(db: Database, rows: int = MIN_ROWS) -> list[str]:
    """Analyze the watched tables never analyzed that hold more than ``rows`` rows;
    return their names. Raises what the database raises."""
    found = await db.fetch_all(Q.stats_never_analyzed, {"tables": list(TABLES), "rows": rows})
    names = [row["relname"] for row in found]
    for name in names:
        await db.execute(TABLES[name])
        log.info("analyzed %s: it had no statistics yet (its plans scanned it whole)", name)
    return names


async def all_analyzed(db: Database) -> bool:
    """Whether every watched table has statistics (by anyone)."""
    return int(await db.fetch_val(Q.stats_all_analyzed, {"tables": list(TABLES)}) or 0) >= len(TABLES)


async def first_analyze(db: Database, *, every: float = CHECK_SECONDS, rows: int = MIN_ROWS) -> None:
    """Check every ``every`` seconds until both tables have statistics (module docstring)."""
    failed_logged = False
    while True:
        try:
            await analyze_unanalyzed(db, rows)
            if await all_analyzed(db):
                return
        except Exception as exc:  # the database is away, or a lock wait ran out: try at the next check
            if not failed_logged:
                log.warning("cannot check the tables' planner statistics: %s", exc)
                failed_logged = True
        await trio.sleep(every)
