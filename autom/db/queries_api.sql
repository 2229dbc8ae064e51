-- The public API's queries (issue 12): ctx.once, and a handler's job transaction
-- (autom/context.py). Named as in queries.sql.

-- name: once_seen
-- Whether the effect named by %(key)s was recorded as done (by any job).
select exists (select 1 from autom_once where key = %(key)s) as seen;

-- name: once_record
-- Record the effect as done, only while this claim still holds its job (lease
-- generation): "held" = 0 means the lease was lost and nothing was written.
-- A key recorded meanwhile by another job is kept as it is (do nothing).
with fence as (
    select id from jobs where id = %(job_id)s and lease = %(lease)s and status = 'running'
),
ins as (
    insert into autom_once (key, job_id) select %(key)s, id from fence
    on conflict (key) do nothing
    returning key
)
select (select count(*) from fence) as held, (select count(*) from ins) as recorded;

-- name: once_keys_of_job
-- The once keys a job recorded (autom.testing reports them).
select key from autom_once where job_id = %(job_id)s order by recorded_at, key;

-- name: block_begin
-- Each `async with ctx.transaction()` block is a savepoint; PostgreSQL keeps nested
-- savepoints of one name apart (RELEASE / ROLLBACK TO take the most recent).
savepoint autom_block;

-- name: block_release
release savepoint autom_block;

-- name: block_rollback
rollback to savepoint autom_block;

-- name: testing_last_job_id
-- autom.testing: the newest job id before a run (what the run enqueues comes after).
select coalesce(max(id), 0) as id from jobs;

-- name: testing_jobs_after
select id, kind, payload, key, recipient, run_at, max_attempts from jobs where id > %(last)s order by id;

-- name: testing_jobs_of_event
select id, kind, payload, key, recipient, run_at, max_attempts from jobs where event_id = %(event_id)s order by id;
