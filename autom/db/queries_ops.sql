-- Operations' queries (autom/ops.py): what the CLI and the admin API read and fix.

-- name: ops_list_jobs
-- Newest first; status and kind filters are optional (NULL = any).
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at
from jobs
where (%(status)s::text is null or status = %(status)s)
  and (%(kind)s::text is null or kind = %(kind)s)
order by id desc
limit %(limit)s;

-- name: ops_failed_jobs
-- The latest failures first.
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at
from jobs
where status = 'failed'
order by finished_at desc nulls last, id desc
limit %(limit)s;

-- name: ops_get_job
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at
from jobs where id = %(id)s;

-- name: ops_retry_job
-- A failed (or pending) job back in the queue now with its attempts reset; a
-- running or done job is left alone (the caller answers 409 / exit 1). Returns the row
-- as this update left it: a worker may claim the job the moment it commits.
with r as (
    update jobs set status = 'pending', attempts = 0, run_at = now(), finished_at = null,
                    locked_until = null, updated_at = now()
     where id = %(id)s and status in ('failed', 'pending')
    returning id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
              recipient, payload, created_at, updated_at, finished_at
),
rcpt as (
    insert into recipients as rc (recipient, next_due_at)
    select recipient, run_at from r where recipient is not null
    on conflict (recipient) do update
        set next_due_at = least(rc.next_due_at, excluded.next_due_at), ver = rc.ver + 1
),
wake as (select pg_notify('autom_jobs', '') from r)
select r.* from r, (select count(*) from wake) w;

-- name: ops_get_event
select e.id, e.source, e.received_at, e.dedup_key, e.headers, e.body,
       coalesce((select array_agg(j.id order by j.id) from jobs j where j.event_id = e.id), '{}') as job_ids
from events e where e.id = %(id)s;

-- name: state_get
select value, updated_at from service_state where name = %(name)s;

-- name: alert_state_flip
-- Turn a watchdog condition on or off; returns a row only for the one caller (of
-- all replicas) whose statement changed it, so each change alerts once. A first
-- row saying "not active" is no change (inserted = true tells the caller).
insert into service_state as s (name, value, updated_at)
values (%(name)s, jsonb_build_object('active', %(active)s::boolean), now())
on conflict (name) do update set value = excluded.value, updated_at = excluded.updated_at
    where coalesce((s.value->>'active')::boolean, false) is distinct from %(active)s::boolean
returning name, (xmax = 0) as inserted;

-- name: prune_done_jobs
-- Finished jobs past retention, a batch at a time. Jobs with a key are kept at
-- least key_keep_seconds so a schedule slot can never be enqueued (and run) twice.
delete from jobs where id in (
    select id from jobs
    where status = 'done' and finished_at < now() - make_interval(secs => %(keep_seconds)s)
      and (key is null or created_at < now() - make_interval(secs => %(key_keep_seconds)s))
    limit %(batch)s
);

-- name: prune_events
-- Old events that no unfinished (pending, running or failed) job needs for a replay.
delete from events where id in (
    select e.id from events e
    where e.received_at < now() - make_interval(secs => %(keep_seconds)s)
      and not exists (select 1 from jobs j where j.event_id = e.id and j.status <> 'done')
    limit %(batch)s
);

-- name: prune_recipients
-- Lock rows of recipients with nothing queued (re-created by the next enqueue).
-- next_due_at is NULL only once a claim retired the row for having no job left,
-- and an enqueue sets it again under the row lock, so this cannot race one.
delete from recipients r
where r.recipient in (
    select recipient from recipients
    where next_due_at is null and (busy_until is null or busy_until < now())
    limit %(batch)s
)
and r.next_due_at is null
and not exists (select 1 from jobs j where j.recipient = r.recipient and j.due_at is not null);
