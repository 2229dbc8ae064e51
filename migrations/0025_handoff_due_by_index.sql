-- 0025: the intake's hand-off asks "is any job due?" by the earliest due time.
--
-- "not exists (select 1 from jobs d where d.due_at <= now())" was planned from the
-- statistics of jobs. With none (autovacuum off, or not yet run) or with a backlog's
-- (nearly every row due), the planner expects many due rows and takes a sequential
-- scan that stops at the first: after a drain nothing is due, and every hand-off read
-- the whole table (20,000 finished jobs: 2.5-8 ms of a 5 ms reply, bench/RESULTS.md,
-- Speed round five). min(due_at) over "due_at is not null" is the first entry of
-- jobs_due_all (an index-only scan, limit 1) under any statistics. Same meaning: no
-- due job when the earliest due time is later than now, or there is none.
-- The rest of the function is 0022's.
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
            -- the earliest due time by jobs_due_all's first live entry, whatever the
            -- statistics (see this migration's head)
            ok := coalesce((select min(d.due_at) from jobs d where d.due_at is not null) > now(), true);
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
