-- The intake's queries (autom/events/): storing webhook deliveries.

-- name: intake_store
-- Store one verified delivery and its jobs in ONE statement (one round trip, and
-- atomic on its own: no BEGIN/COMMIT trips; measured in bench/RESULTS.md, Intake).
-- %(jobs)s is what autom.jobs.store.jobs_json makes; the jobs go in through
-- autom_enqueue (migrations/0002), the queue's one definition of enqueue, with the
-- new event's id. The hop's commit record (%(token)s, intake_commits,
-- migrations/0006) commits with it.
-- The cut-off: %(until)s (the server's clock, epoch seconds; NULL: none) is when the
-- intake stops waiting for the statement. A server that gets to it only after that
-- (it was stopped, or the statement was stuck on its way) stores nothing: go false.
-- One row: go, at (the server's clock, for the next cut-off), the new event's id and
-- jobs made; id NULL for a redelivery (same source and dedup key; a NULL dedup key
-- never collides).
with g as materialized (
    select c.at, %(until)s::float8 is null or c.at <= %(until)s::float8 as go
    from (select date_part('epoch', clock_timestamp()) as at) c
),
ev as (
    insert into events (source, headers, body, dedup_key)
    select %(source)s, %(headers)s::jsonb, %(body)s, %(dedup_key)s from g where g.go
    on conflict (source, dedup_key) do nothing
    returning id
),
st as (
    select ev.id, (select count(*) from autom_enqueue(%(jobs)s::jsonb, ev.id)) as jobs from ev
),
record as (
    insert into intake_commits (token, results)
    select %(token)s::uuid, jsonb_build_array(jsonb_build_array(1, (select id from st), coalesce((select jobs from st), 0)))
    from g where g.go
)
select g.go, g.at, st.id, st.jobs from g left join st on true;

-- name: intake_store_handoff
-- intake_store, but when the delivery made one job that could be claimed now (its
-- recipient free and its line empty, nothing else due: migrations/0012) the job is
-- stored claimed by this process (lease %(lease_seconds)s), and its fields come back
-- for the worker pool (StoreBatcher's hand-off, autom/events/handoff.py). One row: go and at
-- (intake_store's cut-off), the event's id (NULL for a redelivery), the jobs made,
-- the handed-off job's fields or NULLs. "offset 0" keeps the cut-off a one-time
-- filter: the function is not called at all when go is false.
with g as materialized (
    select c.at, %(until)s::float8 is null or c.at <= %(until)s::float8 as go
    from (select date_part('epoch', clock_timestamp()) as at) c
)
select g.go, g.at, h.* from g left join lateral (
    select * from autom_intake_store_handoff(%(source)s, %(headers)s::jsonb, %(body)s, %(dedup_key)s,
                                             %(jobs)s::jsonb, %(token)s::uuid, %(lease_seconds)s)
    where g.go offset 0
) h on true;

-- name: intake_store_many
-- Store several verified deliveries, one after the other, in ONE statement (one
-- transaction: all of them or none): the intake's group commit. %(items)s is what
-- autom.events.batch_items makes; a redelivery, also of an earlier item of the
-- same batch, gets a null id and no jobs, as intake_store would (migrations/0005).
-- The hop's commit record (%(token)s) commits with it (migrations/0006). The cut-off
-- as intake_store_handoff's: go and at in every row; one row with go false and
-- nothing else when the server got to it too late.
with g as materialized (
    select c.at, %(until)s::float8 is null or c.at <= %(until)s::float8 as go
    from (select date_part('epoch', clock_timestamp()) as at) c
)
select g.go, g.at, s.pos, s.event_id, s.jobs_created from g left join lateral (
    select * from autom_intake_store_batch(%(items)s::jsonb, %(token)s::uuid) where g.go offset 0
) s on true order by s.pos;

-- name: intake_commit_burn
-- After a hop's connection dropped: take its token. Returns a row when the hop did not
-- commit (and now never will); no row when it did (it waited for the hop's transaction).
insert into intake_commits (token) values (%(token)s::uuid) on conflict (token) do nothing returning token;

-- name: intake_commit_results
-- What a hop that committed stored (a statement of its own: it must see that commit).
select results from intake_commits where token = %(token)s::uuid;
