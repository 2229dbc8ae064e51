-- 0037: autovacuum per table for the queue's churn (bench/RESULTS.md, Issue 27's sustained run).
--
-- recipients is small (about one row per chat: ~10,000 in the sustained run) but every
-- enqueue, claim and settle updates its recipient's row: at 366 deliveries/s it held
-- ~9,700 live and ~44,000 dead row versions 85 s in, never analyzed. The default
-- thresholds scale with the table (50 + 20 % of its rows to vacuum, 50 + 10 % to
-- analyze): a fixed 2,000 changed rows (about two seconds of that run's updates) makes
-- it due at every autovacuum round (autovacuum_naptime, README) at any size, so its dead
-- versions stay near one round's updates; an analyze of a table this small reads a few
-- hundred pages. recipients' rows are
-- updated in place, so the same threshold suits vacuum and analyze.
alter table recipients set (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 2000
);

-- jobs grows (finished jobs stay until retention prunes them): the default 10 % lets a
-- table of a million jobs go 100,000 changes between analyzes, the planner's idea of
-- how many are unfinished falling behind; 2 % (each job is ~3 changes: insert, claim,
-- settle) re-analyzes about every 20 s at 366 jobs/s on a million rows. Vacuum keeps
-- its default (the visibility map for the index-only counts is set by it, but a
-- finished job is not changed again).
alter table jobs set (autovacuum_analyze_scale_factor = 0.02);
