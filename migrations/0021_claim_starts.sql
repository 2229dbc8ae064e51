-- 0021: attempts count runs started. A job claimed ahead of its run (the worker's
-- prefetch) whose lease runs out before its run started gives its attempt back.
--
-- Which claims had started is known without a write per job: each worker pool
-- registers a row here, and every claim it makes ahead of its runs gets the next
-- number of the pool's start order (jobs.start_ticket; the pool starts them in that
-- order); the pool records the highest number it has started (started_upto), batched
-- with its completions or alone right after a start. A claim that starts at once
-- (an idle worker takes it) gets ticket 0: counted with the claim. The claim of an
-- expired lease (autom/db/queries.sql, claim) counts the lost attempt only if its
-- ticket is within the claimant's started_upto.
create table worker_starts (
    id           bigint generated always as identity primary key,
    started_upto bigint      not null default 0,
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now()
);

-- claimed_by: the worker_starts row of the pool that made the current claim (NULL:
-- claimed by the intake's hand-off, or before this migration: counted); start_ticket:
-- the claim's place in that pool's start order (0: started with the claim). Written by
-- the claim in the row version it writes anyway; a constant default, no table rewrite.
alter table jobs add column claimed_by bigint, add column start_ticket bigint not null default 0;

-- The attempt log (migrations/0008) records a lease taken over by another claim only
-- when the lost attempt counted (attempts went up): a claim made ahead that never
-- started is no attempt and leaves no row, as a release at shutdown leaves none.
drop trigger jobs_attempt_log on jobs;
create trigger jobs_attempt_log
    after update of status, lease on jobs
    for each row
    when (old.status = 'running' and (
              (new.status in ('pending', 'failed') and new.attempts >= old.attempts)
              or (new.status = 'running' and new.lease <> old.lease and new.attempts > old.attempts)))
    execute function autom_record_attempt();
