-- 0029: the trace context stored with a job (autom/tracing.py).
--
-- jobs.trace: a W3C traceparent, the span that enqueued the job (a delivery's, or the
-- attempt of the job whose handler enqueued it); each attempt's span continues it, in
-- whichever process claims the job. NULL when tracing is off (nothing else changes).
-- The three inserts of a job take it from the jobs' JSON ("trace", jobs_json): the
-- bodies are 0022's (autom_enqueue_each, autom_enqueue) and 0025's (the hand-off, which
-- also returns it, so its row type changes: dropped and created anew) with trace added.
alter table jobs add column trace text;

create or replace function autom_enqueue_each(jobs jsonb, event bigint default null)
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
        insert into jobs as j (id, kind, payload, key, recipient, run_at, max_attempts, event_id, trace)
        overriding system value
        select ids[t.n], t.kind, coalesce(t.payload, '{}'::jsonb), t.key, t.recipient, coalesce(t.run_at, now()),
               coalesce(t.max_attempts, (select k.max_attempts from kinds k where k.kind = t.kind), 8),
               coalesce(event, t.event_id), t.trace
        from rows from (jsonb_to_recordset(jobs) as (kind text, payload jsonb, key text, recipient text,
                                                     run_at timestamptz, max_attempts int, event_id bigint,
                                                     trace text))
             with ordinality as t (kind, payload, key, recipient, run_at, max_attempts, event_id, trace, n)
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

create or replace function autom_enqueue(jobs jsonb, event bigint default null)
returns setof bigint
language plpgsql volatile
as $$
begin
    return query
    with ins as (
        insert into jobs (kind, payload, key, recipient, run_at, max_attempts, event_id, trace)
        select t.kind, coalesce(t.payload, '{}'::jsonb), t.key, t.recipient, coalesce(t.run_at, now()),
               coalesce(t.max_attempts, (select k.max_attempts from kinds k where k.kind = t.kind), 8),
               coalesce(event, t.event_id), t.trace
        from jsonb_to_recordset(jobs) as t (kind text, payload jsonb, key text, recipient text,
                                            run_at timestamptz, max_attempts int, event_id bigint, trace text)
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

drop function autom_intake_store_handoff(text, jsonb, text, text, jsonb, uuid, float8);
create function autom_intake_store_handoff(p_source text, p_headers jsonb, p_body text, p_dedup_key text,
                                           p_jobs jsonb, p_token uuid, p_lease_seconds float8)
returns table (event_id bigint, jobs_created bigint, id bigint, kind text, payload jsonb, attempts integer,
               max_attempts integer, lease bigint, locked_until timestamptz, recipient text, key text,
               run_at timestamptz, trace text)
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
        select t.kind, t.payload, t.key, t.recipient, coalesce(t.run_at, now()) as run_at, t.max_attempts, t.trace
          into one
          from jsonb_to_recordset(p_jobs) as t (kind text, payload jsonb, key text, recipient text,
                                                run_at timestamptz, max_attempts int, trace text);
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
            -- the earliest due time by jobs_due_all's first live entry, whatever the
            -- statistics (migrations/0025's head)
            ok := coalesce((select min(d.due_at) from jobs d where d.due_at is not null) > now(), true);
        end if;
    end if;

    if ok then
        -- the claim's update of a due job (queries.sql, claim: claimed), made at insert;
        -- 0 is the lease a new job has (the column's default). autom_lease_next comes
        -- with migrations/0014 (a PL/pgSQL body finds functions when it runs)
        insert into jobs as j (kind, payload, key, recipient, run_at, max_attempts, event_id,
                               status, attempts, lease, locked_until, claimed_at, trace)
        values (one.kind, coalesce(one.payload, '{}'::jsonb), one.key, one.recipient, one.run_at,
                coalesce(one.max_attempts, (select k.max_attempts from kinds k where k.kind = one.kind), 8), ev,
                'running', 1, autom_lease_next(0), now() + make_interval(secs => p_lease_seconds), now(), one.trace)
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
                        handed.lease, handed.locked_until, handed.recipient, handed.key, handed.run_at, handed.trace;
end
$$;
