-- 0035: an enqueue of several recipients locks their rows in recipient order.
--
-- autom_enqueue (the intake's store, one delivery or a batch of them) and
-- autom_enqueue_each (JobStore.enqueue_each, a handler's or a producer's jobs) upsert
-- the row of every recipient they give a job, and hold those row locks until their
-- transaction commits. The upsert took the rows in the order of its grouping (a hash:
-- no order at all), so two transactions storing jobs for the same two chats could
-- each hold one row and wait for the other's: a deadlock, which PostgreSQL breaks only
-- after deadlock_timeout (1 s) by failing one of them (issue 26). Two replicas' intake
-- batches, an intake batch and a handler's transaction, or an intake batch and the
-- completer (settle_many, renew_many: queries.sql, which now lock in this order too)
-- could do it. Every writer of several recipients' rows now takes them in recipient
-- order, so one waits for the other and none waits in a circle.
--
-- The bodies are 0029's with "order by ins.recipient" added to the upsert.

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
        order by ins.recipient
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
        order by ins.recipient
        on conflict (recipient) do update
            set next_due_at = least(r.next_due_at, excluded.next_due_at), ver = r.ver + 1
    ),
    wake as (
        select pg_notify('autom_jobs', '') from ins where ins.run_at <= now() limit 1
    )
    select ins.id from ins, (select count(*) from wake) w order by ins.id;
end
$$;
