-- 0008: what the console and the ops commands need (issue 13): a `cancelled`
-- status, paused kinds, and a log of every attempt's outcome.

-- cancelled: an operator stopped a pending job (also one waiting for its retry). It
-- never runs and raises no alert (jobs_failed_alert fires on 'failed' only); its
-- due_at is NULL like every finished job's, so no claim lane ever sees it.
alter table jobs drop constraint jobs_status_check;
alter table jobs add constraint jobs_status_check
    check (status in ('pending', 'running', 'done', 'failed', 'cancelled'));

-- When the current (or last) attempt was claimed: the start of the attempt that is
-- running, or that ended done, for the attempt log (the ended ones that did not
-- end done have their own rows, below). No index: nothing searches by it, and an
-- unindexed column keeps the claim's update HOT-eligible as before.
alter table jobs add column claimed_at timestamptz;

-- A paused kind's jobs stay pending: the claim skips them (all replicas) until
-- the kind is resumed (autom pause / resume, the console).
create table paused_kinds (
    kind      text primary key,
    paused_at timestamptz not null default now()
);

-- One row per attempt that did not end done: retried after an error, failed for
-- good, or lost its lease (the worker vanished, the job was claimed again). The
-- happy path writes nothing here: the done attempt is the job row itself
-- (claimed_at .. finished_at). Rows go with their job (on delete cascade), so
-- pruning a job prunes its history.
create table job_attempts (
    id         bigint generated always as identity primary key,
    job_id     bigint      not null references jobs (id) on delete cascade,
    attempt    integer     not null,            -- jobs.attempts of that claim (1 = the first run)
    started_at timestamptz,                     -- NULL for a claim made before this migration
    ended_at   timestamptz not null default now(),
    outcome    text        not null check (outcome in ('retry', 'failed', 'lease_expired')),
    error      text
);
create index job_attempts_job on job_attempts (job_id, id);

-- Written by a trigger, so every path that ends an attempt is covered (the worker's
-- outcome writer, a future one, a lease taken over by another claim) and no query
-- can forget it. Attempts given back (a shutdown's release, a deferral: attempts
-- goes down) are not attempts and leave no row.
create function autom_record_attempt() returns trigger
language plpgsql as $$
begin
    insert into job_attempts (job_id, attempt, started_at, outcome, error)
    values (
        old.id, old.attempts, old.claimed_at,
        case when new.status = 'failed' then 'failed'
             when new.status = 'pending' then 'retry'
             else 'lease_expired' end,
        case when new.status = 'running' then 'lease expired: the worker did not finish or renew it'
             else new.last_error end
    );
    return null;
end
$$;

-- WHEN is checked per row without calling the function: a claim of a pending job,
-- a renewal and a completion (running -> done) match nothing and cost nothing more.
create trigger jobs_attempt_log
    after update of status, lease on jobs
    for each row
    when (old.status = 'running' and new.attempts >= old.attempts and (
              new.status in ('pending', 'failed')
              or (new.status = 'running' and new.lease <> old.lease)))
    execute function autom_record_attempt();
