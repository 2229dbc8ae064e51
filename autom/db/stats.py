"""The first ANALYZE of ``jobs`` and ``recipients``, before autovacuum gets to it (why:
docs/design/db.md, "Planner statistics").

``first_analyze`` runs in every role (autom/service.py): one read of
pg_stat_user_tables every ``every`` seconds; a table never analyzed that holds more
than ``rows`` rows is analyzed at most once per process. It returns once each table
has statistics (from anyone) or is not this role's to analyze (said once, at
warning). A failure is logged once and tried again at the next check; it never
stops the caller.
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


async def analyze_unanalyzed(db: Database, rows: int = MIN_ROWS, settled: set[str] | None = None) -> list[str]:
    """Analyze the watched tables never analyzed that hold more than ``rows`` rows and
    that this role may analyze; return their names. ``settled`` (first_analyze's) gets
    the tables that need nothing more here: analyzed (by anyone, or now), or not this
    role's to analyze (said once, at warning); they are skipped. Raises what the
    database raises."""
    settled = set() if settled is None else settled
    names = []
    for t in await db.fetch_all(Q.stats_watched, {"tables": list(TABLES)}):
        name = t["relname"]
        if name in settled:
            continue
        if t["analyzed"]:
            settled.add(name)
        elif not t["may_analyze"]:
            settled.add(name)
            log.warning("cannot give %s its first planner statistics: this role does not own it "
                        "(its owner or autovacuum must analyze it)", name)
        elif t["live_rows"] > rows:
            await db.execute(TABLES[name])
            settled.add(name)
            names.append(name)
            log.info("analyzed %s: it had no statistics yet (its plans scanned it whole)", name)
    return names


async def first_analyze(db: Database, *, every: float = CHECK_SECONDS, rows: int = MIN_ROWS) -> None:
    """Check every ``every`` seconds until each table has statistics or is not this
    role's to analyze; each analyzed at most once here (module docstring)."""
    failed_logged = False
    settled: set[str] = set()
    while True:
        try:
            await analyze_unanalyzed(db, rows, settled)
            if settled >= set(TABLES):
                return
        except Exception as exc:  # the database is away, or a lock wait ran out: try at the next check
            if not failed_logged:
                log.warning("cannot check the tables' planner statistics: %s", exc)
                failed_logged = True
        await trio.sleep(every)
