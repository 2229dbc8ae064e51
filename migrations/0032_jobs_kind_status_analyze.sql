-- 0032: the statistics of 0031 built now, not at autovacuum's next ANALYZE of jobs.
--
-- CREATE STATISTICS (0031) only declares them: ANALYZE builds them, and autovacuum
-- analyzes jobs only after a tenth of its rows changed (hours or days on a big, quiet
-- table). Until then the console has no estimate of a kind and status past its count's
-- cap and says "1,000+" (autom/db/queries_ops.sql, ops_overview_counts), never a guess.
-- ANALYZE reads a sample (at most 300 × default_statistics_target rows: 30,000 pages
-- at most, whatever the table's size), takes a lock that blocks no read or write, and
-- here only the two columns: seconds at worst, on any table. An empty table (a new
-- install) is left alone: analyzed empty, the planner would take it for empty until
-- autovacuum's next ANALYZE, however many jobs arrive meanwhile.
do $$
begin
    if exists (select 1 from jobs) then
        analyze jobs (kind, status);
    end if;
end
$$;
