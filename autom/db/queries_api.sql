-- The public API's queries: ctx.once, and a handler's job transaction
-- (autom/context.py). Named as in queries.sql.

-- name: once_enter
-- Enter a ctx.once block for %(key)s as the claim (%(job_id)s, %(lease)s), only while
-- that claim holds its job ("held" = 0: it does not, nothing is written): insert the
-- key 'held', or take over a 'held' key whose holder's claim is no longer live (its
-- job is not running under that lease, or the lease expired: the holder died or
-- froze; its effect may have happened, the window README names). A key another live
-- claim holds, or one recorded 'done', is left alone: "entered" is 0 and "state" says
-- which (NULL: it changed under this statement's snapshot; look again).
with fence as (
    select id from jobs where id = %(job_id)s and lease = %(lease)s and status = 'running'
),
cur as (
    select o.state from autom_once o where o.key = %(key)s
),
ins as (
    insert into autom_once (key, job_id, lease, state) select %(key)s, id, %(lease)s, 'held' from fence
    on conflict (key) do update set job_id = excluded.job_id, lease = excluded.lease, recorded_at = now()
    where autom_once.state = 'held'
      and not exists (select 1 from jobs j
                       where j.id = autom_once.job_id and j.lease = autom_once.lease
                         and j.status = 'running' and j.locked_until > now())
    returning key
)
select (select count(*) from fence) as held, (select count(*) from ins) as entered,
       (select state from cur) as state;

-- name: once_done
-- The clean exit of a block: the key held by this claim becomes 'done', fenced by
-- the claim (its job running under its lease, locked until the transaction ends so
-- no new claim can take the job in between). In the transaction that commits the
-- block's writes and follow-ups, or alone. "recorded" = 1: written now; "state" =
-- 'done' with recorded 0: this claim's record had committed already (a commit whose
-- answer was lost); otherwise the claim was lost and nothing is written.
with fence as (
    select id from jobs where id = %(job_id)s and lease = %(lease)s and status = 'running' for share
),
upd as (
    update autom_once set state = 'done', recorded_at = now()
    where key = %(key)s and lease = %(lease)s and state = 'held' and exists (select 1 from fence)
    returning key
)
select (select count(*) from upd) as recorded,
       (select state from autom_once where key = %(key)s and lease = %(lease)s) as state;

-- name: once_state
-- Whether this claim's record of %(key)s committed (its transaction's commit got no answer).
select state from autom_once where key = %(key)s and lease = %(lease)s;

-- name: once_release
-- A block that raised (or was cancelled) records nothing: its held key is freed for
-- the next run (only while this claim still holds it).
delete from autom_once where key = %(key)s and lease = %(lease)s and state = 'held';

-- name: once_keys_of_job
-- The once keys a job recorded (autom.testing reports them).
select key from autom_once where job_id = %(job_id)s and state = 'done' order by recorded_at, key;

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

-- name: ctx_cancel
-- ctx.cancel(kind, key): the pending job of that kind and key (also one waiting for
-- its retry) ends cancelled, in the handler's transaction (so only if it commits).
-- The updated row stays locked until then: no claim can take it meanwhile. As
-- ops_cancel_job: a cancelled head of its recipient's line lets the next job run.
with c as (
    update jobs set status = 'cancelled', finished_at = now(), locked_until = null, updated_at = now()
     where kind = %(kind)s and key = %(key)s and status = 'pending'
    returning id, recipient
),
line as (
    update recipients r set next_due_at = least(r.next_due_at, now()), ver = r.ver + 1
      from c where r.recipient = c.recipient
),
wake as (select pg_notify('autom_jobs', '') from c)
select count(*) as cancelled from c, (select count(*) from wake) w;
