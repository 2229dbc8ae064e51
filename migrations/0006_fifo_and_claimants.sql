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
