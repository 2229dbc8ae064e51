"""The first ANALYZE of jobs and recipients (autom/db/stats.py), against the real PostgreSQL.

A fresh database has no statistics: the admission count planned then scans all of jobs
(bench/RESULTS.md, Issue 27's sustained run). After the step it walks jobs_due_all.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import trio

from autom.db import open_database
from autom.db.queries import Q
from autom.db.stats import analyze_unanalyzed, first_analyze
from tests.support.service import wait_until


async def _analyzed(db: Any, table: str) -> bool:
    row = await db.fetch_one(
        "select last_analyze, last_autoanalyze from pg_stat_user_tables where relname = %(t)s", {"t": table})
    return row is not None and (row["last_analyze"] is not None or row["last_autoanalyze"] is not None)


async def _plan(db: Any) -> str:
    rows = await db.fetch_all("explain " + Q.admission_backlog.replace("%(limit)s", "20001"))
    return "\n".join(str(next(iter(row.values()))) for row in rows)


async def _fill(db: Any) -> None:
    # autovacuum kept away from jobs here (on the embedded PostgreSQL it is on): it may
    # analyze the table first, and the test would see it analyzed by someone else
    await db.execute("alter table jobs set (autovacuum_enabled = off)")
    # finished jobs (due_at null) and a few pending ones: what a sustained run leaves
    await db.execute("insert into jobs (kind, status, finished_at) "
                     "select 'bulk.kind', 'done', now() from generate_series(1, 3000)")
    await db.execute("insert into jobs (kind) select 'bulk.kind' from generate_series(1, 20)")
    await db.execute("select pg_stat_force_next_flush()")
    await wait_until(lambda: db.fetch_val(
        "select n_live_tup > 1000 from pg_stat_user_tables where relname = 'jobs'"))


async def test_a_big_unanalyzed_jobs_is_analyzed_and_the_count_walks_the_index(db: Any) -> None:
    await _fill(db)
    assert not await _analyzed(db, "jobs")
    assert "Seq Scan on jobs" in await _plan(db)  # no statistics: the whole table

    assert await analyze_unanalyzed(db) == ["jobs"]  # recipients is empty: left alone

    assert await wait_until(lambda: _analyzed(db, "jobs"))
    plan = await _plan(db)
    assert "Seq Scan on jobs" not in plan and "jobs_due_all" in plan, plan
    assert not await _analyzed(db, "recipients")
    # analyzed once: the next check finds nothing to do
    assert await analyze_unanalyzed(db) == []


async def test_a_small_table_is_left_to_autovacuum(db: Any) -> None:
    await db.execute("alter table jobs set (autovacuum_enabled = off)")
    await db.execute("insert into jobs (kind) select 'bulk.kind' from generate_series(1, 50)")
    assert await analyze_unanalyzed(db) == []
    assert not await _analyzed(db, "jobs")


async def test_first_analyze_returns_once_both_tables_have_statistics(db: Any) -> None:
    await _fill(db)
    await db.execute("analyze recipients")  # as autovacuum or another replica would have
    with trio.fail_after(10):
        await first_analyze(db, every=0.05)  # returns: jobs analyzed here, recipients before
    assert await _analyzed(db, "jobs")


async def test_the_busy_tables_have_their_own_autovacuum_thresholds(db: Any) -> None:
    rows = await db.fetch_all("select relname, reloptions from pg_class where relname in ('jobs', 'recipients')")
    options = {row["relname"]: set(row["reloptions"] or ()) for row in rows}
    assert options["recipients"] == {
        "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=2000",
        "autovacuum_analyze_scale_factor=0", "autovacuum_analyze_threshold=2000",
    }
    assert "autovacuum_analyze_scale_factor=0.02" in options["jobs"]


async def test_a_role_that_does_not_own_the_tables_says_so_once_and_stops(
        db: Any, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """ANALYZE by a role that does not own the table only warns and analyzes nothing: the
    check would have logged "analyzed" and tried again every few seconds for ever."""
    caplog.set_level(logging.INFO, logger="autom.db.stats")  # an "analyzed" line would show
    await _fill(db)
    role = f"autom_not_owner_{psycopg.conninfo.conninfo_to_dict(dsn)['dbname']}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'create role "{role}" login')
    try:
        other = psycopg.conninfo.make_conninfo(dsn, user=role)
        async with open_database(other, min_size=1, max_size=2) as theirs:
            with trio.fail_after(10):
                await first_analyze(theirs, every=0.05)  # returns: nothing here is theirs to analyze
        assert not await _analyzed(db, "jobs")
        said = [r.getMessage() for r in caplog.records if r.name == "autom.db.stats"]
        assert sorted(said) == [
            "cannot give jobs its first planner statistics: this role does not own it "
            "(its owner or autovacuum must analyze it)",
            "cannot give recipients its first planner statistics: this role does not own it "
            "(its owner or autovacuum must analyze it)",
        ], said
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'drop role "{role}"')
