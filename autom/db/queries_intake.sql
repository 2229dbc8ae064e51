-- The intake's queries (autom/web/intake.py): storing webhook deliveries.

-- name: intake_store
-- Store one verified delivery and its jobs in ONE statement (one round trip, and
-- atomic on its own: no BEGIN/COMMIT trips; measured in bench/RESULTS.md, Intake).
-- A redelivery (same source and dedup key) inserts nothing and returns no row;
-- a NULL dedup key never collides. %(jobs)s is a JSON array of
-- {"kind","payload","key","recipient","run_at","max_attempts"}; a job whose key
-- exists is skipped and not counted.
--
-- The jobs part does exactly what enqueue_many (queries.sql) does: KEEP THE TWO IN
-- STEP. tests/integration/test_intake_store.py compares their rows and fails on drift.
with ev as (
    insert into events (source, headers, body, dedup_key)
    values (%(source)s, %(headers)s::jsonb, %(body)s, %(dedup_key)s)
    on conflict (source, dedup_key) do nothing
    returning id
),
ins as (
    insert into jobs (kind, payload, key, recipient, run_at, max_attempts, event_id)
    select t.kind, t.payload, t.key, t.recipient, coalesce(t.run_at, now()), t.max_attempts, ev.id
    from ev, jsonb_to_recordset(%(jobs)s::jsonb)
         as t (kind text, payload jsonb, key text, recipient text, run_at timestamptz, max_attempts int)
    on conflict (key) do nothing
    returning id, recipient, run_at
),
rcpt as (
    insert into recipients as r (recipient, next_due_at)
    select recipient, min(run_at) from ins where recipient is not null group by recipient
    on conflict (recipient) do update
        set next_due_at = least(r.next_due_at, excluded.next_due_at), ver = r.ver + 1
),
wake as (
    select pg_notify('autom_jobs', '') from ins where ins.run_at <= now() limit 1
)
select ev.id, (select count(*) from ins) as jobs, (select count(*) from wake) as woken from ev;
