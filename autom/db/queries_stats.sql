-- Planner statistics (autom/db/stats.py): the first ANALYZE of the busy tables.

-- name: stats_never_analyzed
-- Tables of %(tables)s never analyzed (by hand or by autovacuum) that already hold
-- more than %(rows)s rows: plans made without statistics scan them whole (RESULTS,
-- Issue 27's sustained run). One read of the statistics view, no table touched.
select relname
from pg_stat_user_tables
where schemaname = current_schema() and relname = any(%(tables)s)
  and last_analyze is null and last_autoanalyze is null
  and n_live_tup > %(rows)s;

-- name: stats_analyze_jobs
-- Column statistics for jobs (also invalidates the plans prepared while it was empty).
analyze jobs;

-- name: stats_analyze_recipients
-- Column statistics for recipients (same reason).
analyze recipients;

-- name: stats_all_analyzed
-- How many of %(tables)s have been analyzed once: when all have, the check stops.
select count(*) from pg_stat_user_tables
where schemaname = current_schema() and relname = any(%(tables)s)
  and (last_analyze is not null or last_autoanalyze is not null);
