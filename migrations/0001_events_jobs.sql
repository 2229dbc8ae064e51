-- 0001: events and jobs, the queue's two tables, plus the per-recipient lock rows
-- that make claims fair and keep one recipient's jobs one at a time.

create table events (
    id          bigint generated always as identity primary key,
    source      text        not null,
    headers     jsonb       not null default '{}'::jsonb,
    body        text        not null,             -- byte-for-byte what the sender sent (UTF-8)
    dedup_key   text,                             -- the sender's event id; NULLs never collide
    received_at timestamptz not null default now(),
    constraint events_source_dedup_key unique (source, dedup_key)
);
create index events_received_at on events (received_at);

create table jobs (
    id           bigint generated always as identity primary key,
    kind         text        not null,
    payload      jsonb       not null default '{}'::jsonb,
    status       text        not null default 'pending'
                 check (status in ('pending', 'running', 'done', 'failed')),
    attempts     integer     not null default 0 check (attempts >= 0),   -- claims so far
    max_attempts integer     not null default 8 check (max_attempts >= 1),
    run_at       timestamptz not null default now(),
    locked_until timestamptz,                     -- lease end of the current claim
    last_error   text,
    key          text        unique,              -- a job with a key is created once
    event_id     bigint      references events (id) on delete set null,
    recipient    text,                            -- jobs of one recipient run one at a time
    lease        bigint      not null default 0,  -- lease generation: +1 per claim (fencing)
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now(),
    finished_at  timestamptz,
    -- When the job can be claimed: a pending job at run_at, a running one when its
    -- lease runs out; NULL once finished. One column so the claim walks one index.
    due_at       timestamptz generated always as (
                     case status when 'pending' then run_at when 'running' then locked_until end
                 ) stored
);

-- claim lane for jobs without a recipient
create index jobs_due_free on jobs (due_at) where recipient is null and due_at is not null;
-- a recipient's oldest claimable job
create index jobs_recipient_head on jobs (recipient, run_at) where recipient is not null and due_at is not null;
-- queue lag / stats: the oldest due job
create index jobs_due_all on jobs (due_at) where due_at is not null;
create index jobs_event_id on jobs (event_id) where event_id is not null;
create index jobs_finished on jobs (status, finished_at) where finished_at is not null;
create index jobs_kind_status on jobs (kind, status);

-- One row per recipient that ever had a job. The claim locks these rows
-- (FOR UPDATE SKIP LOCKED) in least-recently-served order: the "busy" flag lives
-- in the locked row, so two claimers can never take two jobs of one recipient
-- (shared/research/fair-claim.md, design C2b).
create table recipients (
    recipient   text primary key,
    busy_until  timestamptz,      -- = locked_until of the recipient's running job
    last_served bigint,           -- serve order; NULL = never served = first in line
    next_due_at timestamptz,      -- earliest run_at of its claimable jobs; NULL = nothing queued
    ver         bigint not null default 0   -- bumped by enqueue, so retiring does not race it
);
create sequence recipients_serve_seq;
create index recipients_fair on recipients (last_served nulls first) where next_due_at is not null;

-- Small facts the service keeps about itself (the last heartbeat, alert states).
create table service_state (
    name       text primary key,
    value      jsonb not null default '{}'::jsonb,
    updated_at timestamptz not null default now()
);
