-- 0028: each attempt keeps its traceback and the lines its handler logged
-- (ctx.log), and operators' actions are recorded (the audit trail).
--
-- The run's outcome writer sets jobs.last_traceback and jobs.run_log with the
-- outcome (no write per log line); the attempt triggers (0008, 0020) copy them
-- into the attempt's row. A done attempt is the job row itself, its log too.
alter table jobs add column last_traceback text, add column run_log jsonb;
alter table job_attempts add column traceback text, add column log jsonb;

create or replace function autom_record_attempt() returns trigger
language plpgsql as $$
begin
    insert into job_attempts (job_id, attempt, started_at, outcome, error, traceback, log)
    values (
        old.id, old.attempts, old.claimed_at,
        case when new.status = 'failed' then 'failed'
             when new.status = 'pending' then 'retry'
             else 'lease_expired' end,
        case when new.status = 'running' then 'lease expired: the worker did not finish or renew it'
             else new.last_error end,
        case when new.status = 'running' then null else new.last_traceback end,
        case when new.status = 'running' then null else new.run_log end
    );
    return null;
end
$$;

create or replace function autom_record_cancelled_attempt() returns trigger
language plpgsql as $$
begin
    insert into job_attempts (job_id, attempt, started_at, outcome, error, traceback, log)
    values (old.id, old.attempts, old.claimed_at, 'cancelled', new.last_error, new.last_traceback, new.run_log);
    return null;
end
$$;

-- Operator actions from the console, the admin API and the CLI, newest read first;
-- pruned with the events' retention (autom/handlers/prune.py).
create table audit_log (
    id     bigint generated always as identity primary key,
    at     timestamptz not null default now(),
    via    text        not null check (via in ('console', 'api', 'cli')),
    action text        not null,
    target text,
    detail jsonb
);
create index audit_log_at on audit_log (at);
create index audit_log_target on audit_log (target) where target is not null;
