-- 0022: keys unique per kind, each kind's max_attempts known to the database, and
-- an enqueue that says, job by job, what it created.
--
-- A job key is unique per kind: the same key under another kind is another job.
-- With one key space, a handler's follow-up keyed "orders.digest:{slot}" was
-- skipped every time because the ticker's own job of that slot had the key. The
-- old index was unique on key alone, so (kind, key) holds for every existing row.
drop index jobs_key;
create unique index jobs_kind_key on jobs (kind, key) where key is not null;

-- Each kind's max_attempts (its handler's), written by every replica at start from
-- its App (JobStore.register_kinds, an upsert): a job whose producer gave none gets
-- its kind's also when it was enqueued from outside the service (autom_enqueue from
-- SQL, autom.enqueue), else 8. During a rolling deploy with two values for one kind
-- the replica that started last wins; jobs a replica enqueues itself (intake,
-- ctx.enqueue, schedule, replay) carry its own App's value. A kind no App registers
-- any more keeps its row (it is read only for jobs of that kind, which fail anyway
-- without a handler).
create table kinds (
    kind         text primary key,
    max_attempts integer not null check (max_attempts >= 1),
    updated_at   timestamptz not null default now()
);

-- jobs: autom_enqueue's JSON array (migrations/0002). One row per job, in the
-- array's order: pos (1-based), id (the new job's, or NULL when a job of its kind
-- with its key exists) and existing (that job's id, NULL for a job created; also
-- NULL in the rare case the existing job was deleted meanwhile). Two jobs of one
-- kind and key in one array: the first is created, the second names it.
--
-- The ids are taken from jobs' sequence before the insert, one per position in
-- order, so each position knows its id without relying on the order in which an
-- INSERT ... SELECT returns rows, and ids ascend in the array's order as before. A
-- job skipped for its key leaves its id unused (as ON CONFLICT did anyway).
-- The existing jobs are looked up in a second statement, only when some job was
-- skipped: it sees a conflicting job another transaction committed while this
-- insert waited for it, and one made earlier by this insert.
create function autom_enqueue_each(jobs jsonb, event bigint default null)
returns table (pos int, id bigint, existing bigint)
language plpgsql volatile
as $$
#variable_conflict use_column
declare
    total int := coalesce(jsonb_array_length(jobs), 0);
    ids bigint[];
    made bigint;
begin
    if total = 0 then
        return;
    end if;
    ids := array(select nextval('jobs_id_seq') from generate_series(1, total));
    with ins as (
        insert into jobs as j (id, kind, payload, key, recipient, run_at, max_attempts, event_id)
        overriding system value
        select ids[t.n], t.kind, coalesce(t.payload, '{}'::jsonb), t.key, t.recipient, coalesce(t.run_at, now()),
               coalesce(t.max_attempts, (select k.max_attempts from kinds k where k.kind = t.kind), 8),
               coalesce(event, t.event_id)
        from rows from (jsonb_to_recordset(jobs) as (kind text, payload jsonb, key text, recipient text,
                                                     run_at timestamptz, max_attempts int, event_id bigint))
             with ordinality as t (kind, payload, key, recipient, run_at, max_attempts, event_id, n)
        order by t.n
        on conflict (kind, key) where key is not null do nothing
        returning j.id, j.recipient, j.run_at
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
    select count(*) into made from ins, (select count(*) from wake) w;
    if made = total then
        return query select g.n, ids[g.n], null::bigint from generate_series(1, total) as g (n);
        return;
    end if;
    return query
        select e.n::int, j.id,
               case when j.id is null then
                   (select o.id from jobs o where o.kind = e.value->>'kind' and o.key = e.value->>'key')
               end
        from jsonb_array_elements(jobs) with ordinality as e (value, n)
        left join jobs j on j.id = ids[e.n]
        order by e.n;
end
$$;

-- The documented function keeps its shape (the ids of the jobs created, ascending)
-- and its own body, 0002's but for the kind's key and max_attempts: the intake and
-- bulk inserts (schedule, replay) need no answer per job. Through
-- autom_enqueue_each it cost 0.43 ms a call of one job against 0.35 ms (min of 15
-- rounds of 600 calls, 2 shared cores); this body keeps 0002's cost. Keep the two
-- inserts alike (tests/integration/test_intake_store.py compares their rows).
create or replace function autom_enqueue(jobs jsonb, event bigint default null)
returns setof bigint
language plpgsql volatile
as $$
begin
    return query
    with ins as (
        insert into jobs (kind, payload, key, recipient, run_at, max_attempts, event_id)
        select t.kind, coalesce(t.payload, '{}'::jsonb), t.key, t.recipient, coalesce(t.run_at, now()),
               coalesce(t.max_attempts, (select k.max_attempts from kinds k where k.kind = t.kind), 8),
               coalesce(event, t.event_id)
        from jsonb_to_recordset(jobs) as t (kind text, payload jsonb, key text, recipient text,
                                            run_at timestamptz, max_attempts int, event_id bigint)
        on conflict (kind, key) where key is not null do nothing
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

-- The intake's hand-off (migrations/0012) as it was, but for the key, which is the
-- kind's (the check that it is new, and ON CONFLICT's arbiter: the old one names an
-- index this migration dropped), and max_attempts, which falls back to the kind's.
create or replace function autom_intake_store_handoff(p_source text, p_headers jsonb, p_body text, p_dedup_key text,
                                           p_jobs jsonb, p_token uuid, p_lease_seconds float8)
returns table (event_id bigint, jobs_created bigint, id bigint, kind text, payload jsonb, attempts integer,
               max_attempts integer, lease bigint, locked_until timestamptz, recipient text, key text,
               run_at timestamptz)
language plpgsql volatile
as $$
#variable_conflict use_column
declare
    ev bigint;
    one record;
    ok boolean := false;
    made bigint := 0;
    handed jobs%rowtype;
begin
    insert into events as e (source, headers, body, dedup_key)
    values (p_source, p_headers, p_body, p_dedup_key)
    on conflict (source, dedup_key) do nothing
    returning e.id into ev;
    if ev is null then  -- a redelivery: nothing stored, no row
        insert into intake_commits (token, results) values (p_token, jsonb_build_array(jsonb_build_array(1, null, 0)));
        return;
    end if;

    if jsonb_typeof(p_jobs) = 'array' and jsonb_array_length(p_jobs) = 1 then
        select t.kind, t.payload, t.key, t.recipient, coalesce(t.run_at, now()) as run_at, t.max_attempts
          into one
          from jsonb_to_recordset(p_jobs) as t (kind text, payload jsonb, key text, recipient text,
                                                run_at timestamptz, max_attempts int);
        ok := one.run_at <= now()
              and not exists (select 1 from paused_kinds p where p.kind = one.kind)
              and (one.key is null or not exists (select 1 from jobs k where k.kind = one.kind and k.key = one.key));
        if ok and one.recipient is not null then
            -- lock the recipient's row (autom_enqueue's upsert, as its enqueue would)
            insert into recipients as r (recipient, next_due_at) values (one.recipient, one.run_at)
            on conflict (recipient) do update
                set next_due_at = least(r.next_due_at, excluded.next_due_at), ver = r.ver + 1;
            -- a new statement, a new snapshot: free by the claim's test, and an empty line
            select (r.busy_until is null or r.busy_until < now()
                    or coalesce((select b.status <> 'running' and b.locked_until = r.busy_until
                                   from jobs b where b.id = r.busy_job), false))
                   and not exists (select 1 from jobs l where l.recipient = one.recipient and l.due_at is not null)
              into ok
              from recipients r where r.recipient = one.recipient;
        end if;
        if ok then
            ok := not exists (select 1 from jobs d where d.due_at <= now());
        end if;
    end if;

    if ok then
        -- the claim's update of a due job (queries.sql, claim: claimed), made at insert;
        -- 0 is the lease a new job has (the column's default). autom_lease_next comes
        -- with migrations/0014 (a PL/pgSQL body finds functions when it runs)
        insert into jobs as j (kind, payload, key, recipient, run_at, max_attempts, event_id,
                               status, attempts, lease, locked_until, claimed_at)
        values (one.kind, coalesce(one.payload, '{}'::jsonb), one.key, one.recipient, one.run_at,
                coalesce(one.max_attempts, (select k.max_attempts from kinds k where k.kind = one.kind), 8), ev,
                'running', 1, autom_lease_next(0), now() + make_interval(secs => p_lease_seconds), now())
        on conflict (kind, key) where key is not null do nothing
        returning j.* into handed;
        if handed.id is not null then
            made := 1;
            if one.recipient is not null then
                -- the claim's mark
                update recipients r
                   set busy_until = handed.locked_until, busy_job = handed.id,
                       last_served = nextval('recipients_serve_seq')
                 where r.recipient = one.recipient;
            end if;
        end if;
    else
        select count(*) into made from autom_enqueue(p_jobs, ev);
    end if;

    insert into intake_commits (token, results) values (p_token, jsonb_build_array(jsonb_build_array(1, ev, made, handed.id, handed.lease)));
    return query select ev, made, handed.id, handed.kind, handed.payload, handed.attempts, handed.max_attempts,
                        handed.lease, handed.locked_until, handed.recipient, handed.key, handed.run_at;
end
$$;
