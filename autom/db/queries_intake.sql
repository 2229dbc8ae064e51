-- The intake's queries (autom/events.py): storing webhook deliveries.

-- name: intake_store
-- Store one verified delivery and its jobs in ONE statement (one round trip, and
-- atomic on its own: no BEGIN/COMMIT trips; measured in bench/RESULTS.md, Intake).
-- A redelivery (same source and dedup key) inserts nothing and returns no row;
-- a NULL dedup key never collides. %(jobs)s is what autom.jobs.store.jobs_json
-- makes; the jobs go in through autom_enqueue (migrations/0002), the queue's one
-- definition of enqueue, with the new event's id.
with ev as (
    insert into events (source, headers, body, dedup_key)
    values (%(source)s, %(headers)s::jsonb, %(body)s, %(dedup_key)s)
    on conflict (source, dedup_key) do nothing
    returning id
)
select ev.id, (select count(*) from autom_enqueue(%(jobs)s::jsonb, ev.id)) as jobs from ev;

-- name: intake_store_many
-- Store several verified deliveries, one after the other, in ONE statement (one
-- transaction: all of them or none): the intake's group commit. %(items)s is what
-- autom.events.batch_items makes; a redelivery, also of an earlier item of the
-- same batch, gets a null id and no jobs, as intake_store would (migrations/0005).
select pos, event_id, jobs_created from autom_intake_store_many(%(items)s::jsonb) order by pos;
