-- The queue's health (autom/jobs/health.py, its one reader): what ops, /metrics and
-- the watchdog show and alert on. Read-only and cheap enough to run every few seconds.

-- name: health_job_counts
-- Jobs by status and kind (an index-only scan of jobs_kind_status).
select kind, status, count(*) as n from jobs group by kind, status;

-- name: health_queue_lag
-- Seconds the oldest due pending job has waited (0 when none is due).
select coalesce(extract(epoch from now() - min(due_at)), 0)::float8 as lag
from jobs where due_at <= now() and status = 'pending';

-- name: health_failed_since
-- Jobs that failed for good in the last %(seconds)s seconds.
select count(*) from jobs where status = 'failed' and finished_at > now() - make_interval(secs => %(seconds)s);
