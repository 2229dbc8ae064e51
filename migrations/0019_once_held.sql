-- ctx.once holds its key while its block runs: a row is 'held' by the run that
-- entered it (job_id, lease: the claim's lease value) and becomes 'done' when the
-- block exits cleanly, in one transaction with what the block wrote and enqueued.
-- Another run entering the same key waits while the holder's claim is live (the
-- job running under that lease, its lease not expired) and takes the key over when
-- it is not (the holder died, froze past its lease, or its block raised and the
-- release could not be written). Rows written before this migration are 'done'.
alter table autom_once
    add column lease bigint,
    add column state text not null default 'done' check (state in ('held', 'done'));
