-- 0004: the alert outbox. A job that fails for good gets its alert row in the same
-- statement that fails it (the trigger below fires on every path to 'failed', so no
-- query can forget it); autom/alerts.py sends pending rows to the alert chat and marks
-- them sent once Telegram accepted them. A kill between the failure and the message
-- therefore cannot lose the alert; at worst (a kill between send and mark) one is sent
-- twice. Sent rows stay RETAIN_DONE_DAYS for audit, then maintenance.prune deletes them.

create table alerts (
    id            bigint generated always as identity primary key,
    job_id        bigint      not null,          -- no foreign key: the record outlives a deleted job
    kind          text        not null,
    attempts      integer     not null,
    error         text,
    created_at    timestamptz not null default now(),
    tries         integer     not null default 0,       -- deliveries that failed so far
    next_try_at   timestamptz not null default now(),   -- not before (backoff after a failure)
    claimed_until timestamptz,                          -- a sender is on it until then (its lease)
    sent_at       timestamptz,                          -- Telegram accepted it (alone or in a summary)
    sent_as       text check (sent_as in ('single', 'summary'))
);
-- the senders' walk: the few unsent rows, oldest first
create index alerts_unsent on alerts (id) where sent_at is null;
-- retention
create index alerts_sent_at on alerts (sent_at) where sent_at is not null;

create function autom_record_alert() returns trigger
language plpgsql as $$
begin
    insert into alerts (job_id, kind, attempts, error)
    values (new.id, new.kind, new.attempts, new.last_error);
    return null;
end
$$;

-- WHEN is checked as each row is updated: other status changes (claims, completions)
-- queue nothing and call nothing.
create trigger jobs_failed_alert
    after update of status on jobs
    for each row
    when (new.status = 'failed' and old.status is distinct from 'failed')
    execute function autom_record_alert();
