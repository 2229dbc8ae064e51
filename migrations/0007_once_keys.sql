-- ctx.once(key) (issue 12): one row per side effect recorded as done. A handler's
-- `async with ctx.once(key)` block runs its effect only while no row has the key,
-- and a clean exit of the block inserts it in its own short transaction, fenced by
-- the job's lease generation (autom/db/queries_api.sql, once_record).
create table autom_once (
    key         text primary key,
    job_id      bigint,
    recorded_at timestamptz not null default now()
);
