-- Planner statistics (autom/db/stats.py): the first ANALYZE of the busy tables.

-- name: stats_watched
-- The tables of %(tables)s: whether they have been analyzed once (by hand or by
-- autovacuum), the rows they hold, and whether this role may analyze them. ANALYZE
-- by another role only warns and does nothing (PostgreSQL: the table's owner, the
-- database's owner or a superuser; pg_has_role is true for a superuser and for a
-- member of the owner role). One read of the statistics view, no table touched.
select s.relname,
       s.last_analyze is not null or s.last_autoanalyze is not null as analyzed,
       s.n_live_tup as live_rows,
       pg_has_role(c.relowner, 'USAGE')
       or (select pg_has_role(d.datdba, 'USAGE') from pg_database d where d.datname = current_database())
           as may_analyze
from pg_stat_user_tables s
join pg_class c on c.oid = s.relid
where s.schemaname = current_schema() and s.relname = any(%(tables)s)
order by s.relname;

-- name: stats_analyze_jobs
-- Column statistics for jobs (also invalidates the plans prepared while it was empty).
analyze jobs;

-- name: stats_analyze_recipients
-- Column statistics for recipients (same reason).
analyze recipients;
