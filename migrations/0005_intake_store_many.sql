-- 0005: the intake's group commit: several deliveries stored by ONE statement, in
-- one transaction (one thread hop, one round trip and one commit for a batch
-- instead of one of each per delivery; autom/web/intake.py, StoreBatcher).
--
-- items: a JSON array of [source, headers (object), body (text), dedup_key (text or
-- null), jobs (autom_enqueue's array)]. The events go in one after the other, in
-- array order, as intake_store (queries_intake.sql) inserts one: a redelivery of a
-- (source, dedup key) stored before, or earlier in the same array, inserts nothing
-- and gets no jobs. The new events' jobs then go in through ONE autom_enqueue call
-- (migrations/0002, the queue's one definition of enqueue; one call instead of one
-- per event halves PostgreSQL's time for a batch of 64), in array order, so a job
-- key used by two deliveries goes to the first, as in separate transactions.
-- Returns one row per item, in order: its position (1-based), the new event's id
-- (null for a redelivery) and how many jobs it created.
create function autom_intake_store_many(items jsonb)
returns table (pos int, event_id bigint, jobs_created bigint)
language plpgsql volatile
as $$
declare
    item jsonb;
    n int;
    new_id bigint;
    ids bigint[] := '{}';
    new_jobs jsonb := '[]';
    created bigint[];
begin
    for item, n in select e.value, e.n from jsonb_array_elements(items) with ordinality as e (value, n)
                   order by e.n loop
        insert into events as ev (source, headers, body, dedup_key)
        values (item->>0, item->1, item->>2, item->>3)
        on conflict (source, dedup_key) do nothing
        returning ev.id into new_id;
        ids := ids || new_id;
        if new_id is not null then
            new_jobs := new_jobs || coalesce(
                (select jsonb_agg(j.value || jsonb_build_object('event_id', new_id) order by j.n)
                 from jsonb_array_elements(item->4) with ordinality as j (value, n)),
                '[]');
        end if;
    end loop;
    select array_agg(x) into created from autom_enqueue(new_jobs) as x;
    return query
        with counts as (
            select j.event_id as ev, count(*) as c from jobs j where j.id = any(created) group by j.event_id
        )
        select u.n::int, u.id, coalesce(counts.c, 0)
        from unnest(ids) with ordinality as u (id, n) left join counts on counts.ev = u.id
        order by u.n;
end
$$;
