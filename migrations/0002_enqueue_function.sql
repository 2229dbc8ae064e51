-- 0002: one definition of "enqueue", shared by the queue (enqueue_many) and the
-- intake (intake_store), which stores an event and its jobs in one statement.
-- Before this, the intake carried a copy of enqueue's CTEs that had to be kept in
-- step by hand.
--
-- jobs: a JSON array of {"kind","payload","key","recipient","run_at","max_attempts","event_id"}
-- (missing fields take the column defaults); event: sets event_id of every job.
-- A job whose key exists already is skipped. The recipient's lock row is created
-- or told it has a job due (ver+1 keeps a concurrent claim from retiring it).
-- NOTIFY wakes idle workers of other processes when a job is due now.
-- Returns the ids of the jobs created.
create function autom_enqueue(jobs jsonb, event bigint default null)
returns setof bigint
language sql volatile
as $$
    with ins as (
        insert into jobs (kind, payload, key, recipient, run_at, max_attempts, event_id)
        select t.kind, coalesce(t.payload, '{}'::jsonb), t.key, t.recipient, coalesce(t.run_at, now()),
               coalesce(t.max_attempts, 8), coalesce(event, t.event_id)
        from jsonb_to_recordset(jobs) as t (kind text, payload jsonb, key text, recipient text,
                                            run_at timestamptz, max_attempts int, event_id bigint)
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
    select id from ins, (select count(*) from wake) w order by id
$$;
