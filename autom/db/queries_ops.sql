-- Operations' queries (autom/ops.py): what the CLI and the admin API read and fix.

-- name: ops_list_jobs
-- Newest first; every filter is optional (NULL = any). "before" is the keyset
-- cursor (the last id of the previous page): an index walk from there, never an
-- OFFSET scan. since/until bound created_at. The statement is planned with its
-- values (not prepared), so the NULL tests of absent filters fold away. Also how
-- many match (Operations.count_jobs): counted with limit = the cap (the same walk,
-- stopped there), past it the planner's estimate (EXPLAIN with no limit to speak of).
-- A recipient's jobs are two reads, each newest first and stopped at the page, then
-- merged: its finished jobs, a walk of jobs_recipient_done (migrations/0034), and its
-- unfinished ones, its line (jobs_recipient_line) read whole and sorted (the intake
-- keeps a line near MAX_PENDING_PER_RECIPIENT). Without a recipient the first is the
-- one walk (jobs_pkey) and the second folds away. The filters are written out in
-- both: each read applies them before its limit.
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at
from ((
    select * from jobs
    where (%(recipient)s::text is null or (recipient = %(recipient)s and due_at is null))
      and (%(status)s::text is null or status = %(status)s)
      and (%(kind)s::text is null or kind = %(kind)s)
      and (%(event_id)s::bigint is null or event_id = %(event_id)s)
      and (%(since)s::timestamptz is null or created_at >= %(since)s)
      and (%(until)s::timestamptz is null or created_at < %(until)s)
      and (%(failed_since)s::timestamptz is null or finished_at >= %(failed_since)s)
      and (%(before)s::bigint is null or id < %(before)s)
    order by id desc
    limit %(limit)s
) union all (
    select * from jobs
    where recipient = %(recipient)s and due_at is not null
      and (%(status)s::text is null or status = %(status)s)
      and (%(kind)s::text is null or kind = %(kind)s)
      and (%(event_id)s::bigint is null or event_id = %(event_id)s)
      and (%(since)s::timestamptz is null or created_at >= %(since)s)
      and (%(until)s::timestamptz is null or created_at < %(until)s)
      and (%(failed_since)s::timestamptz is null or finished_at >= %(failed_since)s)
      and (%(before)s::bigint is null or id < %(before)s)
    order by id desc
    limit %(limit)s
)) jobs
order by id desc
limit %(limit)s;

-- name: ops_list_failed
-- Failed jobs, newest failure first (jobs_finished), with ops_list_jobs' filters
-- (since/until bound created_at, failed_since finished_at). The keyset cursor is the
-- last row's (finished_at, id): before_at, or that job's own finished_at when the
-- caller has only its id. A failed job's due_at is NULL: a recipient's are in
-- jobs_recipient_done (migrations/0034), said so the planner may walk it.
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at
from jobs
where status = 'failed' and finished_at is not null
  and (%(kind)s::text is null or kind = %(kind)s)
  and (%(recipient)s::text is null or (recipient = %(recipient)s and due_at is null))
  and (%(event_id)s::bigint is null or event_id = %(event_id)s)
  and (%(since)s::timestamptz is null or created_at >= %(since)s)
  and (%(until)s::timestamptz is null or created_at < %(until)s)
  and (%(failed_since)s::timestamptz is null or finished_at >= %(failed_since)s)
  and (%(before)s::bigint is null
       or (finished_at, id) < (coalesce(%(before_at)s::timestamptz,
                                        (select b.finished_at from jobs b where b.id = %(before)s)),
                               %(before)s))
order by finished_at desc, id desc
limit %(limit)s;

-- name: ops_failed_jobs
-- The latest failures first.
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at
from jobs
where status = 'failed'
order by finished_at desc nulls last, id desc
limit %(limit)s;

-- name: ops_get_job
select id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
       recipient, payload, created_at, updated_at, finished_at, claimed_at, run_log
from jobs where id = %(id)s;

-- name: ops_jobs_by_ids
-- An event's jobs (its page), oldest first.
select id, kind, status, attempts, max_attempts, last_error, key, recipient, created_at, finished_at
from jobs where id = any (%(ids)s::bigint[]) order by id limit 500;

-- name: ops_job_attempts
-- The attempts of a job that did not end done, oldest first (migrations/0008, 0028),
-- numbered on across manual retries (a retry resets jobs.attempts, not this count).
select row_number() over (order by id) as attempt, started_at as started, ended_at as ended, outcome, error,
       traceback, log
from job_attempts where job_id = %(id)s order by id
limit 1000;

-- name: ops_record_action
-- One operator action (the audit trail, migrations/0028).
insert into audit_log (via, action, target, detail) values (%(via)s, %(action)s, %(target)s, %(detail)s);

-- name: ops_audit
-- The operator actions, newest first.
select at, via, action, target, detail from audit_log order by at desc, id desc limit %(limit)s;

-- name: ops_target_actions
-- The operator actions on one target (a job: 'job:ID'), oldest first.
select at, via, action, target, detail from audit_log where target = %(target)s order by at, id limit 1000;

-- name: ops_retry_jobs
-- Jobs back in the queue now with their attempts reset, if their status is one of
-- %(statuses)s (one job: failed, cancelled or pending; bulk: failed only); the others
-- are left alone (the caller answers 409 / counts them skipped). Returns the rows as
-- this update left them: a worker may claim a job the moment it commits.
with held as materialized (
    -- the recipients' rows locked in recipient order before any job row, as the claim
    -- (recipient, then its head job) and every writer of several (renew_many's held):
    -- updating a pending job first and its recipient after could deadlock with a claim
    -- of that job. The jobs' recipients are read without locking them.
    select rc.recipient from recipients rc
     where rc.recipient in (select j.recipient from jobs j where j.id = any (%(ids)s::bigint[]))
     order by rc.recipient
       for no key update of rc
),
r as (
    update jobs set status = 'pending', attempts = 0, run_at = now(), finished_at = null,
                    locked_until = null, deferred_since = null, updated_at = now()
      from (select count(*) from held) k
     where id = any (%(ids)s::bigint[]) and status = any (%(statuses)s::text[])
    returning id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
              recipient, payload, created_at, updated_at, finished_at
),
rcpt as (
    insert into recipients as rc (recipient, next_due_at)
    select recipient, min(run_at) from r where recipient is not null group by recipient
    order by recipient  -- rows in recipient order, as every writer of several (migrations/0035)
    on conflict (recipient) do update
        set next_due_at = least(rc.next_due_at, excluded.next_due_at), ver = rc.ver + 1
),
wake as (select pg_notify('autom_jobs', '') from r limit 1)
select r.* from r, (select count(*) from wake) w order by r.id;

-- name: ops_cancel_job
-- If its status is one of %(statuses)s: a pending job (also one waiting for its retry) ends cancelled: it is never
-- claimed (due_at becomes NULL) and raises no alert. A running job ends cancelled
-- too: its claim is gone (status is no longer 'running'), so its worker's next
-- renewal finds it lost and cancels the handler, and every fenced write of that run
-- (completion, retry, failure, ctx.transaction) matches nothing: no retry, no alert.
-- Its locked_until stays, so its recipient is free at once (the claim's busy_job
-- test). The NOTIFY wakes the workers (the job may have held back its recipient's
-- later jobs); its payload 'cancel' asks them to renew now rather than at their next
-- lease/3 turn (autom/service.py), so the handler stops within about a second.
with o as (
    select id, status from jobs where id = %(id)s and status = any (%(statuses)s::text[]) for update
),
c as (
    update jobs j set status = 'cancelled', finished_at = now(), updated_at = now(),
                      locked_until = case when o.status = 'running' then j.locked_until end,
                      last_error = case when o.status = 'running' then 'cancelled by an operator while it ran'
                                        else j.last_error end
      from o where j.id = o.id
    returning j.id, j.kind, j.status, j.attempts, j.max_attempts, j.run_at, j.locked_until, j.last_error, j.key,
              j.event_id, j.recipient, j.payload, j.created_at, j.updated_at, j.finished_at, o.status as was
),
-- a cancelled head of its recipient's line (one waiting for its retry, say) lets the
-- next job run now: the claim may have retired the recipient until that retry
line as (
    update recipients r set next_due_at = least(r.next_due_at, now()), ver = r.ver + 1
      from c where r.recipient = c.recipient
),
wake as (select pg_notify('autom_jobs', case when c.was = 'running' then 'cancel' else '' end) from c)
select c.* from c, (select count(*) from wake) w;

-- name: ops_reschedule_job
-- A pending job (also one waiting for its retry) runs not before %(run_at)s: its retry
-- delay is replaced. It keeps its place in its recipient's line (queued_at keeps the
-- run_at it was first queued for, migrations/0006). The recipient's next_due_at is
-- moved earlier if need be (the claim may have retired it until the old run_at), and
-- the NOTIFY wakes the workers of every replica.
with r as (
    update jobs set run_at = %(run_at)s, queued_at = coalesce(queued_at, run_at), updated_at = now()
     where id = %(id)s and status = 'pending'
    returning id, kind, status, attempts, max_attempts, run_at, locked_until, last_error, key, event_id,
              recipient, payload, created_at, updated_at, finished_at
),
line as (
    update recipients rc set next_due_at = least(coalesce(rc.next_due_at, r.run_at), r.run_at), ver = rc.ver + 1
      from r where rc.recipient = r.recipient
),
wake as (select pg_notify('autom_jobs', '') from r)
select r.* from r, (select count(*) from wake) w;

-- name: ops_failed_ids
-- The failed jobs a bulk retry takes (kind, recipient, since = finished at or after,
-- event_id and created_since/created_until = the list's created_at bounds; each optional), oldest first, at most %(limit)s: the caller retries them in batches.
-- A recipient's failed jobs: through jobs_recipient_done, as in ops_list_failed.
select id from jobs
where status = 'failed'
  and (%(kind)s::text is null or kind = %(kind)s)
  and (%(recipient)s::text is null or (recipient = %(recipient)s and due_at is null))
  and (%(since)s::timestamptz is null or finished_at >= %(since)s)
  and (%(event_id)s::bigint is null or event_id = %(event_id)s)
  and (%(created_since)s::timestamptz is null or created_at >= %(created_since)s)
  and (%(created_until)s::timestamptz is null or created_at < %(created_until)s)
order by id
limit %(limit)s;

-- name: ops_count_failed
-- How many failed jobs a bulk retry would take, per kind (the confirm page), each count
-- stopped at %(cap)s (a count of a whole big table costs what a page must not; past the
-- cap the caller asks the planner, as the lists do: "about N"). Kinds come from a loose
-- index scan of jobs_kind_status (one probe per kind, at most 100), each kind's failed
-- jobs counted through the same index. Filters as in ops_failed_ids.
with recursive kinds as (
    (select kind from jobs where (%(kind)s::text is null or kind = %(kind)s) order by kind limit 1)
    union all
    select (select j.kind from jobs j where j.kind > k.kind and %(kind)s::text is null order by j.kind limit 1)
    from kinds k where k.kind is not null
),
k as (select kind from kinds where kind is not null limit 100),
c as (
    select k.kind, (select count(*) from (
        select 1 from jobs j
        where j.kind = k.kind and j.status = 'failed'
          and (%(recipient)s::text is null or (j.recipient = %(recipient)s and j.due_at is null))
          and (%(since)s::timestamptz is null or j.finished_at >= %(since)s)
          and (%(event_id)s::bigint is null or j.event_id = %(event_id)s)
          and (%(created_since)s::timestamptz is null or j.created_at >= %(created_since)s)
          and (%(created_until)s::timestamptz is null or j.created_at < %(created_until)s)
        limit %(cap)s) f) as n
    from k
)
select kind, n from c where n > 0 order by n desc, kind;

-- name: ops_known_kinds
-- The kinds some replica's App registered (migrations/0022: written at every start).
select kind from kinds order by kind;

-- name: ops_get_event
select e.id, e.source, e.received_at, e.dedup_key, e.headers, e.body,
       coalesce((select array_agg(j.id order by j.id) from jobs j where j.event_id = e.id), '{}') as job_ids
from events e where e.id = %(id)s;

-- name: ops_list_events
-- Newest first; source and received_at bounds optional; "before" as in ops_list_jobs.
select e.id, e.source, e.received_at, e.dedup_key, octet_length(e.body) as body_bytes,
       (select count(*) from jobs j where j.event_id = e.id) as jobs
from events e
where (%(source)s::text is null or e.source = %(source)s)
  and (%(since)s::timestamptz is null or e.received_at >= %(since)s)
  and (%(until)s::timestamptz is null or e.received_at < %(until)s)
  and (%(before)s::bigint is null or e.id < %(before)s)
order by e.id desc
limit %(limit)s;

-- name: ops_pause_kind
-- Returns a row only when the kind was not paused already.
insert into paused_kinds (kind) values (%(kind)s) on conflict (kind) do nothing returning kind, paused_at;

-- name: ops_resume_kind
-- Returns a row only when the kind was paused; the NOTIFY wakes idle workers of every replica.
with r as (delete from paused_kinds where kind = %(kind)s returning kind),
wake as (select pg_notify('autom_jobs', '') from r)
select r.kind from r, (select count(*) from wake) w;

-- name: ops_paused_kinds
select kind, paused_at from paused_kinds order by kind;

-- name: ops_statement_timeout
-- For the rest of the current transaction only (the console's bounded reads). A lock
-- wait gives up a little earlier (lock_timeout, SQLSTATE 55P03), so a table locked by
-- someone else is told apart from a query that reads too much (57014).
select set_config('statement_timeout', %(ms)s, true),
       set_config('lock_timeout', greatest(1, %(ms)s::int * 9 / 10)::text, true);

-- name: ops_overview_counts
-- Jobs by kind and status for the console's overview, each count capped at %(cap)s
-- (a count stops at the cap: "1,000+" costs what 1,000 rows cost, at any table
-- size). Kinds come from a loose index scan of jobs_kind_status (one probe per
-- kind, not a scan of every row), at most 100 of them. "estimate" is what the
-- planner's statistics say of the same kind and status (a count past the cap is
-- said as "about N"), read in this one statement rather than one EXPLAIN per count:
-- the combination's share of ANALYZE's sample in the multivariate MCV list of
-- migrations/0031 times the table's rows now (reltuples per page times its pages
-- now, as the planner scales it). NULL where there is none: before the first
-- ANALYZE since 0031 (migrations/0032), or a combination too rare to be listed.
with recursive kinds as (
    (select kind from jobs order by kind limit 1)
    union all
    select (select j.kind from jobs j where j.kind > k.kind order by j.kind limit 1)
    from kinds k where k.kind is not null
),
k as (select kind from kinds where kind is not null limit 100),
size as (
    select c.relnamespace::regnamespace::name as schema,
           c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int) as rows
    from pg_class c where c.oid = 'jobs'::regclass and c.reltuples >= 0 and c.relpages > 0
),
est as (
    select s.most_common_vals[i][1] as kind, s.most_common_vals[i][2] as status,
           round(s.most_common_freqs[i] * size.rows)::bigint as n
    from size
    join pg_stats_ext s on s.schemaname = size.schema and s.tablename = 'jobs'
                       and s.statistics_name = 'jobs_kind_status_mcv' and not s.inherited
    cross join generate_subscripts(s.most_common_vals, 1) as i
)
select k.kind, s.status,
       (select count(*) from (select 1 from jobs j where j.kind = k.kind and j.status = s.status
                              limit %(cap)s) c) as n,
       e.n as estimate
from k cross join unnest(array['pending', 'running', 'done', 'failed', 'cancelled']) as s (status)
left join est e on e.kind = k.kind and e.status = s.status
order by k.kind, s.status;

-- name: ops_throughput
-- Done and failed jobs per minute over the last %(minutes)s minutes (jobs_finished).
select date_trunc('minute', finished_at) as minute, status, count(*) as n
from jobs
where status in ('done', 'failed') and finished_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
group by 1, 2
order by 1;

-- name: ops_failed_by_kind
-- Jobs that failed for good in the last %(minutes)s minutes, by kind (jobs_finished).
select kind, count(*) as n
from jobs
where status = 'failed' and finished_at >= now() - make_interval(mins => %(minutes)s)
group by kind
order by n desc, kind
limit 50;

-- name: ops_unsent_alerts
-- How many alerts wait (alerts_unsent), and the oldest of them: its job, how often
-- sending it failed, when it is tried next (the overview's card says why they wait).
select (select count(*) from alerts where sent_at is null) as count, o.job_id, o.kind, o.tries, o.next_try_at,
       o.created_at
from (select 1) one
left join lateral (select job_id, kind, tries, next_try_at, created_at from alerts
                   where sent_at is null order by id limit 1) o on true;

-- name: ops_heartbeat
select updated_at from service_state where name = 'heartbeat';

-- name: state_get
select value, updated_at from service_state where name = %(name)s;

-- name: alert_state_flip
-- Turn a watchdog condition on or off; returns a row only for the one caller (of
-- all replicas) whose statement changed it, so each change alerts once. A first
-- row saying "not active" is no change (inserted = true tells the caller).
insert into service_state as s (name, value, updated_at)
values (%(name)s, jsonb_build_object('active', %(active)s::boolean), now())
on conflict (name) do update set value = excluded.value, updated_at = excluded.updated_at
    where coalesce((s.value->>'active')::boolean, false) is distinct from %(active)s::boolean
returning name, (xmax = 0) as inserted;

-- name: prune_done_jobs
-- Finished (done or cancelled) jobs past retention, a batch at a time (their
-- job_attempts rows go with them: on delete cascade). Jobs with a key are kept at
-- least key_keep_seconds so a schedule slot can never be enqueued (and run) twice,
-- and the newest slot job of each kind (key "{kind}:{slot}", payload {"slot": slot},
-- as the ticker makes it) is kept however old: its slot may still be the current one
-- (a monthly cron, every_minutes over key_keep_seconds), and the ticker would enqueue
-- it again. An older slot job cannot come back: the ticker only enqueues the current slot.
delete from jobs where id in (
    select j.id from jobs j
    where j.status in ('done', 'cancelled') and j.finished_at < now() - make_interval(secs => %(keep_seconds)s)
      and (j.key is null
           or (j.created_at < now() - make_interval(secs => %(key_keep_seconds)s)
               and (j.key is distinct from j.kind || ':' || (j.payload->>'slot')
                    or exists (select 1 from jobs n
                               where n.kind = j.kind and n.id > j.id and n.key = n.kind || ':' || (n.payload->>'slot')))))
    limit %(batch)s
);

-- name: prune_events
-- Old events that no unfinished (pending, running or failed) job needs for a replay.
delete from events where id in (
    select e.id from events e
    where e.received_at < now() - make_interval(secs => %(keep_seconds)s)
      and not exists (select 1 from jobs j where j.event_id = e.id and j.status not in ('done', 'cancelled'))
    limit %(batch)s
);

-- name: prune_audit
-- Operator actions older than the events' retention.
delete from audit_log where id in (
    select id from audit_log where at < now() - make_interval(secs => %(keep_seconds)s) order by at
    limit %(batch)s
);

-- name: prune_recipients
-- Lock rows of recipients with nothing queued (re-created by the next enqueue).
-- next_due_at is NULL only once a claim retired the row for having no job left,
-- and an enqueue sets it again under the row lock, so this cannot race one.
-- Rows are locked in recipient order and the ones another transaction holds are
-- skipped (the next prune takes them): a delete that waited for them, taking rows
-- in any order, deadlocked with enqueues of several recipients (seen under stress).
delete from recipients r
where r.recipient in (
    select recipient from recipients
    where next_due_at is null and (busy_until is null or busy_until < now())
    order by recipient
    limit %(batch)s
    for update skip locked
)
and r.next_due_at is null
and r.paused_at is null  -- a pause outlives an empty line (migrations/0027)
and not exists (select 1 from jobs j where j.recipient = r.recipient and j.due_at is not null);

-- name: prune_once_keys
-- ctx.once keys past retention (keep_seconds: the longer of RETAIN_DONE_DAYS and
-- RETAIN_EVENTS_DAYS). Until then a retry, a rerun or a replay of the event sees
-- the effect as done; after it no job or event is left that could repeat it.
delete from autom_once where key in (
    select key from autom_once where recorded_at < now() - make_interval(secs => %(keep_seconds)s)
    order by recorded_at
    limit %(batch)s
);

-- name: prune_intake_commits
-- The intake's commit records (migrations/0006) are read only seconds after a hop.
delete from intake_commits where token in (
    select token from intake_commits where at < now() - interval '1 hour' limit %(batch)s
);

-- name: console_session_ended
-- Whether the console session of this nonce was logged out (a row of console_end_session).
select exists (select 1 from service_state where name = %(name)s);

-- name: console_end_session
-- A logged-out console session, kept until its cookie would have expired anyway (every
-- replica refuses it meanwhile); the rows of sessions past that go at the same time.
with expired as (
    delete from service_state
    where name like 'console session ended %%' and (value->>'until')::timestamptz < now()
)
insert into service_state (name, value, updated_at)
values (%(name)s, jsonb_build_object('until', %(until)s::timestamptz), now())
on conflict (name) do nothing;

-- name: ops_recipient_pause
-- Pause a recipient (migrations/0027): the claim skips it in every replica. Its row
-- is made if it has none yet. Returns paused_at (the first pause's, if paused already).
insert into recipients as rc (recipient, paused_at) values (%(recipient)s, now())
on conflict (recipient) do update set paused_at = coalesce(rc.paused_at, now())
returning paused_at;

-- name: ops_recipient_resume
-- Resume a paused recipient: walked by the claim again now (its next_due_at moved to
-- now: the claim may have retired it meanwhile), and the workers of every replica woken.
with r as (
    update recipients set paused_at = null, next_due_at = now(), ver = ver + 1
     where recipient = %(recipient)s and paused_at is not null
    returning recipient
),
wake as (select pg_notify('autom_jobs', '') from r)
select r.recipient from r, (select count(*) from wake) w;

-- name: ops_recipient_purge
-- Every pending job of the recipient (also one waiting for its retry) ends cancelled;
-- none of them is claimed (due_at becomes NULL). Returns how many. Found in its line
-- (jobs_recipient_line: a pending job's due_at is its run_at, never NULL).
with c as (
    update jobs set status = 'cancelled', finished_at = now(), locked_until = null, updated_at = now(),
                    last_error = 'purged by an operator with its recipient'
     where recipient = %(recipient)s and status = 'pending' and due_at is not null
    returning id
)
select count(*) as n from c;

-- name: ops_recipient_state
select paused_at from recipients where recipient = %(recipient)s;

-- name: ops_recipient_timeline
-- A recipient's story, newest first: for a page of its jobs (newest first, before the
-- job id %(before)s; its finished and its unfinished jobs read apart and merged, as in
-- ops_list_jobs), each job's creation, every attempt that did not end done
-- (job_attempts), how it finished, the events that made them, and the operator actions
-- (audit_log, migrations/0028, by audit_log_target) on these jobs and on the recipient
-- itself. An action on the recipient belongs to the page whose jobs'
-- creation times span it: from the page's oldest job's (none on the last page) up to
-- the previous page's oldest (job %(before)s; none on the first page), so paging shows
-- each once. Messages sent are the finished entries of its Telegram jobs (with the
-- parts they sent).
with j as (
    select id, kind, status, attempts, max_attempts, event_id, created_at, finished_at, last_error, telegram_parts
    from ((
        select * from jobs
        where recipient = %(recipient)s and due_at is null and (%(before)s::bigint is null or id < %(before)s)
        order by id desc
        limit %(limit)s
    ) union all (
        select * from jobs
        where recipient = %(recipient)s and due_at is not null and (%(before)s::bigint is null or id < %(before)s)
        order by id desc
        limit %(limit)s
    )) jobs
    order by id desc
    limit %(limit)s
),
span as (
    select case when (select count(*) from j) < %(limit)s then '-infinity'::timestamptz
                else (select created_at from j order by id limit 1) end as since,
           coalesce((select created_at from jobs where id = %(before)s::bigint), 'infinity') as until
)
select * from (
    select j.created_at as at, 'job' as type, j.id as job_id, j.kind, j.status, null::int as attempt,
           null::text as error, j.event_id, null::text as source, null::jsonb as parts,
           null::text as via, null::text as action, null::jsonb as detail
    from j
    union all
    select a.ended_at, 'attempt', a.job_id, j.kind, a.outcome, a.attempt, a.error, j.event_id, null, null,
           null, null, null
    from j join job_attempts a on a.job_id = j.id
    union all
    select j.finished_at, case when j.status = 'done' and j.telegram_parts is not null then 'sent'
                               else j.status end,
           j.id, j.kind, j.status, j.attempts, j.last_error, j.event_id, null, j.telegram_parts, null, null, null
    from j where j.finished_at is not null
    union all
    select e.received_at, 'event', null, null, null, null, null, e.id, e.source, null, null, null, null
    from events e where e.id in (select j.event_id from j where j.event_id is not null)
    union all
    select a.at, 'action', j.id, j.kind, null, null, null, null, null, null, a.via, a.action, a.detail
    from j join audit_log a on a.target = 'job:' || j.id
    union all
    select * from (
        select a.at, 'action', null::bigint, null, null, null::int, null, null::bigint, null, null::jsonb,
               a.via, a.action, a.detail
        from audit_log a, span
        where a.target = 'recipient:' || %(recipient)s and a.at >= span.since and a.at < span.until
        order by a.at desc
        limit 500
    ) r
) t
order by at desc nulls last, job_id desc nulls last, type;
