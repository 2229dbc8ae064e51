-- 0006 (issue 11): a recipient's jobs run in creation order, also across retries (CONTRACT.md,
-- Queue semantics: a FIFO group). A retry or a deferral moves run_at to the next try;
-- queued_at keeps the run_at the job was first queued for, so the job keeps its place
-- in its recipient's line while it waits, and holds back the jobs queued after it.
-- It stays NULL until the job first waits (coalesce(queued_at, run_at) is the place),
-- so enqueue writes nothing new.
alter table jobs add column queued_at timestamptz;

-- A recipient's line: its unfinished jobs in queue order. The claim takes the first
-- one (limit 1) and claims it only when it is due; a job waiting for its retry at the
-- front holds the line. Cancelled, done and failed jobs have due_at NULL: out of line.
create index jobs_recipient_line on jobs (recipient, (coalesce(queued_at, run_at)), id)
    where recipient is not null and due_at is not null;

-- The line index replaces the run_at-ordered one: nothing walks a recipient's jobs
-- in run_at order any more, and every claim and completion (non-HOT updates)
-- would keep writing both.
drop index jobs_recipient_head;

-- The alert outbox: whose claim a row is. Every claim writes a new token; renewing,
-- marking and releasing match it, so a sender whose lease ran out (a slow Telegram)
-- and whose rows another sender claimed neither renews, marks nor frees them
-- (autom/alerts.py). NULL: never claimed.
alter table alerts add column claimant text;

-- The intake's commit records (autom/events.py). Every hop of the intake writes one
-- row with what it stored, in its own transaction. When the connection drops after
-- the statement was sent, the intake does not know whether it committed; it then
-- inserts the hop's token itself: that insert waits for the hop's transaction if it
-- is still open, and fails on the conflict if the hop committed (then its results
-- are read here) or wins if it did not (then the hop can never commit: its own
-- insert would conflict). results NULL: burnt by that check, nothing was stored.
-- Pruned after an hour by maintenance.prune.
create table intake_commits (
    token   uuid primary key,
    results jsonb,                  -- [[pos, event_id or null, jobs created], ...]
    at      timestamptz not null default now()
);
create index intake_commits_at on intake_commits (at);

-- autom_intake_store_many (0005) plus the hop's commit record, in its transaction.
create function autom_intake_store_batch(items jsonb, token uuid)
returns table (pos int, event_id bigint, jobs_created bigint)
language plpgsql volatile
as $$
declare
    stored jsonb;
begin
    select coalesce(jsonb_agg(jsonb_build_array(s.pos, s.event_id, s.jobs_created) order by s.pos), '[]')
      into stored
      from autom_intake_store_many(items) s;
    insert into intake_commits (token, results) values (token, stored);
    return query
        select (e->>0)::int, (e->>1)::bigint, (e->>2)::bigint
        from jsonb_array_elements(stored) e order by (e->>0)::int;
end
$$;
