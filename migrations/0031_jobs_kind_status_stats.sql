-- 0031: counts past the console's cap said as an estimate ("about 45,000"), not "1,000+".
--
-- The console counts exactly up to 1,000 (a count over a limited subquery: cheap at any
-- table size); past that it asks the planner how many rows it expects (EXPLAIN of the
-- same filter) and says "about N". The planner multiplies the columns' frequencies as if
-- kind and status were independent, which they are not (failures gather in a few kinds),
-- so it gets the kind-and-status combinations from this multivariate MCV list, built by
-- ANALYZE (autovacuum's, or the bench's) at no cost to writes.
create statistics if not exists jobs_kind_status_mcv (mcv) on kind, status from jobs;
