-- 0003: jobs.key is unique through a partial index (key is not null) instead of a
-- unique constraint over every row.
--
-- Most jobs have no key, and a btree keeps an entry for NULL too: every claim and
-- every completion (non-HOT updates: status and due_at change) added one more NULL
-- entry to jobs_key_key. The partial index holds only the keyed jobs. Keys stay
-- unique (NULLs never collided anyway). Measured with bench/drain.py, 20,000 no-op
-- jobs, 3 interleaved runs each: drain +22 % without recipients (11.1k -> 13.5k
-- jobs/s) and +30 % over 1,000 recipients (7.8k -> 10.2k), PostgreSQL CPU per job
-- 46 -> 41 and 92 -> 74 us (bench/RESULTS.md, Worker).
--
-- ON CONFLICT must name a partial index's predicate to use it as its arbiter, so
-- autom_enqueue (0002) is redefined with "on conflict (key) where key is not null";
-- nothing else changes in it. Its callers (enqueue_many, the intake's intake_store
-- and autom_intake_store_many of 0005) keep calling it as before.
--
-- Checked before dropping: no query names jobs_key_key or relies on the constraint
-- (only this ON CONFLICT). jobs_due_all and jobs_kind_status stay: dropping
-- jobs_due_all made a recipient lookup pick a worse index (the drain over 1,000
-- recipients fell to 0.7k jobs/s), and ops_job_counts (/metrics, autom status) reads
-- jobs_kind_status with an index-only scan that a sequential scan would make 2-2.5x
-- slower on a 300,000-row table, for 4 us of PostgreSQL CPU per job.

alter table jobs drop constraint jobs_key_key;
create unique index jobs_key on jobs (key) where key is not null;

create or replace function autom_enqueue(jobs jsonb, event bigint default null)
returns setof bigint
language sql volatile
as $$
    with ins as (
        insert into jobs (kind, payload, key, recipient, run_at, max_attempts, event_id)
        select t.kind, coalesce(t.payload, '{}'::jsonb), t.key, t.recipient, coalesce(t.run_at, now()),
               coalesce(t.max_attempts, 8), coalesce(event, t.event_id)
        from jsonb_to_recordset(jobs) as t (kind text, payload jsonb, key text, recipient text,
                                            run_at timestamptz, max_attempts int, event_id bigint)
        on conflict (key) where key is not null do nothing
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
    select id from ins, (select count(*) from wake) w order by id
$$;
