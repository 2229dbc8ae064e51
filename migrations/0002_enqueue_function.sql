-- 0002: one definition of "enqueue", shared by the queue (enqueue_many) and the
-- intake (intake_store, autom_intake_store_many of 0005), which store an event and
-- its jobs in one statement. Before this, the intake carried a copy of enqueue's
-- CTEs that had to be kept in step by hand.
--
-- jobs.key is unique through a partial index (key is not null) instead of a unique
-- constraint over every row. Most jobs have no key, and a btree keeps an entry for
-- NULL too: every claim and every completion (non-HOT updates: status and due_at
-- change) added one more NULL entry to jobs_key_key. The partial index holds only
-- the keyed jobs; keys stay unique. Measured with bench/drain.py, 20,000 no-op jobs,
-- 3 interleaved runs each: drain +22 % without recipients and +30 % over 1,000
-- recipients (bench/RESULTS.md, Worker). ON CONFLICT must name the partial index's
-- predicate to use it as its arbiter: "on conflict (key) where key is not null".
-- jobs_due_all and jobs_kind_status stay: dropping jobs_due_all made a recipient
-- lookup pick a worse index, and ops_job_counts reads jobs_kind_status with an
-- index-only scan.
alter table jobs drop constraint jobs_key_key;
create unique index jobs_key on jobs (key) where key is not null;

-- jobs: a JSON array of {"kind","payload","key","recipient","run_at","max_attempts","event_id"}
-- (missing fields take the column defaults); event: sets event_id of every job.
-- A job whose key exists already is skipped. The recipient's lock row is created
-- or told it has a job due (ver+1 keeps a concurrent claim from retiring it).
-- NOTIFY wakes idle workers of other processes when a job is due now.
-- Returns the ids of the jobs created.
--
-- PL/pgSQL, not LANGUAGE sql: PostgreSQL 15 plans the body of a sql function it
-- cannot inline (this one writes) anew at each call, so preparing the calling
-- statement saved nothing; PL/pgSQL keeps its statements' plans for the session.
-- One job on one connection, 600 calls each: 0.58 ms (sql) against 0.41 ms.
create function autom_enqueue(jobs jsonb, event bigint default null)
returns setof bigint
language plpgsql volatile
as $$
begin
    return query
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
        select ins.recipient, min(ins.run_at) from ins where ins.recipient is not null group by ins.recipient
        on conflict (recipient) do update
            set next_due_at = least(r.next_due_at, excluded.next_due_at), ver = r.ver + 1
    ),
    wake as (
        select pg_notify('autom_jobs', '') from ins where ins.run_at <= now() limit 1
    )
    select ins.id from ins, (select count(*) from wake) w order by ins.id;
end
$$;
