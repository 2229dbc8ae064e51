-- Every runtime query of autom, by name (see autom/db/queries.py).
-- Parameters are psycopg's named placeholders: %(name)s.
-- State changes are single statements guarded by state and lease generation.

-- name: migrations_try_lock
-- Serialises migration runners across replicas until the transaction ends; false when
-- another runner holds it (then the runner says so and waits: migrations_lock).
select pg_try_advisory_xact_lock(hashtext('autom.migrations'));

-- name: migrations_lock
select pg_advisory_xact_lock(hashtext('autom.migrations'));

-- name: migrations_table
-- checksum: SHA-256 of the applied file (autom/db/migrate.py); added to tables made
-- before it was kept, under the lock above.
create table if not exists schema_migrations (
    version    integer primary key,
    name       text not null,
    applied_at timestamptz not null default now()
);
alter table schema_migrations add column if not exists checksum text;

-- name: migrations_applied
select version, checksum from schema_migrations order by version;

-- name: migrations_record
insert into schema_migrations (version, name, checksum) values (%(version)s, %(name)s, %(checksum)s);

-- name: migrations_checksum
update schema_migrations set checksum = %(checksum)s where version = %(version)s and checksum is null;

-- name: user_migrations_table
-- The user's own migrations (App(migrations=...)), numbered apart from autom's.
create table if not exists user_migrations (
    version    integer primary key,
    name       text not null,
    checksum   text not null,
    applied_at timestamptz not null default now()
);

-- name: user_migrations_applied
select version, checksum from user_migrations order by version;

-- name: user_migrations_record
insert into user_migrations (version, name, checksum) values (%(version)s, %(name)s, %(checksum)s);

-- name: enqueue_many
-- Insert jobs (a JSON array, see autom_enqueue in migrations/0002); a job whose
-- kind and key exist already is skipped. Returns the ids created.
select autom_enqueue as id from autom_enqueue(%(jobs)s::jsonb);

-- name: enqueue_each
-- enqueue_many, one row per job in the array's order (migrations/0022): its
-- position, the new id or NULL, and the existing job's id when it was skipped.
select pos, id, existing from autom_enqueue_each(%(jobs)s::jsonb) order by pos;

-- name: kinds_register
-- Each kind's max_attempts from this replica's App (migrations/0022), for jobs
-- enqueued without one; an upsert at every start (the last replica to start wins).
-- Rows in kind order, so replicas starting together lock them in one order.
insert into kinds as k (kind, max_attempts)
select t.kind, t.max_attempts
from unnest(%(kinds)s::text[], %(max_attempts)s::int[]) as t (kind, max_attempts)
order by t.kind
on conflict (kind) do update set max_attempts = excluded.max_attempts, updated_at = now()
    where k.max_attempts is distinct from excluded.max_attempts;

-- name: claim
-- Claim up to %(n)s due jobs (pending and due, or running with an expired lease):
-- at most one per recipient, recipients in least-recently-served order, a
-- recipient only while it has no unexpired running job and only the head of its
-- line (creation order; a job waiting for its retry holds it); recipient-less
-- jobs by due time. Jobs of a paused kind (paused_kinds, migrations/0008) are
-- skipped. The two lanes take turns (see pick), so a backlog in one cannot hold
-- back the other. Each claim takes a new lease (autom_lease_next, migrations/0014:
-- the next generation and 32 random bits, never a value an earlier claim of the job
-- had, even one lost in a crash) and counts an attempt (attempts counts runs
-- started; see "claimed" below for a claim made ahead whose run never started, and
-- for the at-most-once kinds). %(durable)s false: the
-- claim commits asynchronously, and the worker confirms it (confirm_claims) while its
-- handlers start (autom/jobs/store.py: the idle path); true: the server's setting. A
-- recipient whose line has nothing due is retired as its last claim ends (retire_lines
-- after complete_many, settle_many: line_due), so
-- the fair walk below does not trip over it; retire_idle sweeps up the few rows
-- those could not retire (bench/RESULTS.md, Speed round two: walking the front of
-- the order here in every claim cost as many head probes again as the claim's own
-- walk, and planning it).
with rc as (
    select r.recipient, h.id, r.last_served
    from recipients r
    cross join lateral (
        -- the head of the recipient's line (jobs_recipient_line, migrations/0006): its
        -- oldest unfinished job in queue order, claimed only once it is due itself; a
        -- later job never overtakes it (a FIFO group per recipient: README, Reliability)
        select j.id, j.kind, j.due_at from jobs j
        where j.recipient = r.recipient and j.due_at is not null
        order by coalesce(j.queued_at, j.run_at), j.id
        limit 1
    ) h
    where r.next_due_at <= now()
      -- free: not busy, or its lease ran out, or the claim that made it busy has
      -- ended (busy_job, migrations/0011: completing a job writes nothing here). A
      -- scalar subquery, one primary key probe per row walked: as EXISTS, PostgreSQL
      -- may hash a scan of every job instead
      and (r.busy_until is null or r.busy_until < now()
           or (select b.status <> 'running' and b.locked_until = r.busy_until
                 from jobs b where b.id = r.busy_job))
      and h.due_at <= now()
      -- a paused kind at a recipient's head holds the recipient back (its order stays)
      and h.kind <> all (select p.kind from paused_kinds p)
      -- a paused recipient (migrations/0027) is skipped until resumed
      and r.paused_at is null
    order by r.last_served nulls first
    limit %(n)s
    for update of r skip locked
),
nc as (
    -- a walk of jobs_due_free in due order that stops after n rows. The limit is a
    -- subquery, so the planner cannot read it as a number and plans for a fast start
    -- (a tenth of the rows it expects). With "limit n" and statistics that expected
    -- fewer due recipient-less jobs than n (the table analyzed while empty), it read
    -- every due recipient-less job through a bitmap index scan and sorted them, in
    -- every claim: claims of 63 from 20,000 jobs with a recipient and 20,000 without
    -- took 10.3-10.9 ms against 6.0-6.4 (bench/RESULTS.md, Speed round four)
    select j.id, j.due_at from jobs j
    where j.recipient is null and j.due_at <= now() and j.kind <> all (select p.kind from paused_kinds p)
    order by j.due_at
    limit (select %(n)s)
    for update skip locked
),
pick as (
    -- The lanes take turns: each lane's first, then each lane's second, and so on,
    -- so when both have work each gets at least floor(n/2) of the claim (the rest
    -- goes to whichever has more). A coin decides which lane goes first within a
    -- turn: with n = 1 neither lane can starve the other either. Ordering the two
    -- lanes together by run_at instead let a recipient-less backlog hold every
    -- recipient back until it had drained (bench/RESULTS.md, Fairness).
    select x.id
    from (
        select id, row_number() over (order by last_served nulls first) as turn, true as fair from rc
        union all
        select id, row_number() over (order by due_at) as turn, false as fair from nc
    ) x, (select random() < 0.5 as fair_first) coin
    order by x.turn, x.fair <> coin.fair_first
    limit %(n)s
),
p as (
    -- the claim's jobs in the order the worker starts them (the rows come back in it)
    select array(select id from pick) as ids
),
claimed as (
    -- "= any (array(...))", not a join with pick: once the claim is prepared (psycopg
    -- does so at its 6th run on a connection) and PostgreSQL uses its generic plan
    -- (limit unknown), the join hashed a sequential scan of jobs: 13.7 against 6.1 ms
    -- for a claim of 63 out of a 20,000-job backlog. The due guard (rechecked on the
    -- newest row version) is "is true" so that it cannot be an index condition: with a
    -- long-running service's statistics (nearly every job finished, due_at NULL)
    -- "due_at <= now()" looks like one row, and the update walked jobs_due_all, every
    -- due job of both lanes, in every claim (1.7-3x the drain, bench/RESULTS.md, Speed
    -- round four); it finds its jobs by primary key.
    --
    -- Attempts count runs started. The worker starts the first now_n jobs of the
    -- claim at once (its idle runners): ticket 0, counted now. The rest wait for a
    -- runner, claimed ahead: each gets the next number of the pool's start order
    -- (ticket + its place after those; returned), and the pool records the highest it started
    -- (worker_starts.started_upto, migrations/0021). When such a claim's lease runs out
    -- (its worker killed, the database away) and this claim takes the job over, the
    -- lost attempt counts only if its run had started; otherwise it is given back
    -- (attempts stays). A run that started in the moment before its start was recorded
    -- (one write of the pool's outcome writer) is not counted: the one window left.
    --
    -- At-most-once (App.handler(at_most_once=True)): the decision is made here, by
    -- the count. A job whose attempts this claim makes 2 or more had a run start
    -- before, and that run did not end (a handler's error fails an at-most-once job, a
    -- shutdown that cut its run short fails it too): the worker fails it, "lost with
    -- its worker (at-most-once)", one alert, without running it again
    -- (autom/worker/executor.py). Replay is the greater harm for such a kind; the price is
    -- that a run lost with its worker is not retried, and a run started in the window
    -- above may run twice.
    update jobs j
       set status = 'running', lease = autom_lease_next(j.lease),
           attempts = j.attempts + case when j.status = 'running' and j.start_ticket > coalesce(
                          (select w.started_upto from worker_starts w where w.id = j.claimed_by), j.start_ticket)
                      then 0 else 1 end,
           claimed_by = %(claimant)s::bigint,
           start_ticket = coalesce(nullif(greatest(0, array_position((select ids from p), j.id) - %(now_n)s::int), 0)
                                   + %(ticket)s::bigint, 0),
           locked_until = now() + make_interval(secs => %(lease_seconds)s), updated_at = now(),
           claimed_at = now()
     where j.id = any ((select ids from p)::bigint[]) and (j.due_at <= now()) is true
    returning j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.lease, j.locked_until,
              j.recipient, j.key, j.event_id, j.run_at, j.trace, j.start_ticket
),
mark as (
    update recipients r
       set busy_until = c.locked_until, busy_job = c.id, last_served = nextval('recipients_serve_seq')
      from claimed c where r.recipient = c.recipient
),
sync as (
    -- for this statement's transaction only (set_config(..., true))
    select set_config('synchronous_commit',
                      case when %(durable)s then current_setting('synchronous_commit') else 'off' end, true)
)
-- received_at: when the job's event arrived (Job.received_at), a primary key probe of
-- events per claimed job that has one (bench/RESULTS.md, Job.received_at)
select c.*, case when c.event_id is not null then (select e.received_at from events e where e.id = c.event_id) end as received_at
from claimed c, sync order by array_position((select ids from p), c.id);

-- name: confirm_claims
-- Which of these claims (id, lease) are held, committed durably: a claim that commits
-- asynchronously (claim, durable false) is lost if the server crashes before its WAL
-- is flushed. This statement finds each claim still there (else it was lost, or has
-- ended) and takes a KEY SHARE lock on its row: the lock is WAL-logged, so this
-- transaction commits durably, and its flush covers every commit before it, the
-- claims it found included. KEY SHARE does not wait for, nor hold back, the
-- completion or renewal of the same rows (those take NO KEY UPDATE).
select j.id from jobs j
 where j.id = any (%(ids)s::bigint[])
   and (j.id, j.lease) in (select * from unnest(%(ids)s::bigint[], %(leases)s::bigint[]))
   and j.status = 'running'
   for key share of j;

-- name: claimant_register
-- A worker pool's row for its start order (migrations/0021); rows of pools gone for a
-- month go (a job still claimed by one counts its lost attempt: the safe side).
with old as (delete from worker_starts where updated_at < now() - interval '30 days')
insert into worker_starts default values returning id;

-- name: starts_record
-- The highest start_ticket whose run this pool has started (it starts them in order).
-- Written alone right after a start when the outcome writer has nothing else to write,
-- else with its completions (complete_many: starts).
update worker_starts set started_upto = %(upto)s::bigint, updated_at = now()
 where id = %(claimant)s::bigint and started_upto < %(upto)s::bigint;

-- name: retire_idle
-- Retire the recipients at the front of the fair order whose line has nothing due
-- (the head waits for its retry or its run_at, or the line is empty) until their
-- head is due, so the claim's walk does not trip over them. complete_many and
-- settle_many retire a recipient as its claim ends; this sweeps up what they
-- could not (an enqueue or a settle changed the row in between, a cancelled job).
-- The fetcher runs it when it goes idle, at most once per poll (autom/worker/fetcher.py).
-- ver: an enqueue that commits meanwhile bumps it, and the row is left alone.
-- Returns how many rows it retired.
with idle as (
    select r.recipient, f.next_run
    from (
        select r0.recipient, r0.ver,
               -- when the head of its line is due (a head waiting for its retry holds the line)
               (select j.due_at from jobs j
                 where j.recipient = r0.recipient and j.due_at is not null
                 order by coalesce(j.queued_at, j.run_at), j.id
                 limit 1) as next_run
        from recipients r0
        where r0.next_due_at <= now()
          -- free, as the claim's walk counts it
          and (r0.busy_until is null or r0.busy_until < now()
               or (select b.status <> 'running' and b.locked_until = r0.busy_until
                     from jobs b where b.id = r0.busy_job))
        order by r0.last_served nulls first
        limit %(n)s
    ) f
    join recipients r on r.recipient = f.recipient
    where r.ver = f.ver and (f.next_run is null or f.next_run > now())
    for update of r skip locked
)
update recipients r set next_due_at = i.next_run from idle i where r.recipient = i.recipient;

-- name: complete_many
-- Mark claims done; only a claim that still holds its lease generation counts.
-- "more": the job's recipient has another job due now (its turn came with this
-- completion, so the worker should claim again); "idle": its line has nothing due now
-- (nothing left, or a head waiting for its retry or run_at), so the recipient is to be
-- retired (retire_lines, a statement of its own right after this one commits).
-- Nothing here writes a recipient's row: the claim's walk sees that its busy_job ended
-- (migrations/0011), and the intake's enqueue, which upserts the recipient's row of every
-- job it stores, never waits for this transaction. Retiring here made it wait: the
-- intake's batch stores updates of a chat whose last job was being completed in that
-- instant, and its upsert waited on the row lock of this statement's retire, which
-- itself could wait for the previous batch's durable commit (bench/RESULTS.md, "The
-- sender's tail": Lock/transactionid behind "Mark claims done").
-- durable false (the completer): asynchronous commit, see autom/jobs/store.py
-- (set_config(..., true) lasts until this statement's commit). durable true (inside
-- a handler's transaction: JobStore.write with tx, Run.complete_in): the server's
-- setting, since the caller's transaction holds the handler's writes too.
with d as (
    -- found by primary key ("id = any"), each job's lease checked against the one given
    -- for its id (ids are distinct: JobStore.write). "(id, lease) in (select *
    -- from unnest(ids, leases))" checked every pair against every row found (a nested-loop
    -- semi join, 63 x 32 comparisons for a claim's worth), and a join with unnest walked
    -- the running jobs' entries in jobs_kind_status: 2.5-5 µs of PostgreSQL CPU per job
    -- more (bench/RESULTS.md, Speed round three)
    -- a done job keeps no last_error (its attempts keep theirs, job_attempts)
    update jobs set status = 'done', finished_at = now(), updated_at = now(), last_error = null,
                    last_traceback = null, run_log = null
     where id = any (%(ids)s::bigint[])
       and lease = (%(leases)s::bigint[])[array_position(%(ids)s::bigint[], id)]
       and status = 'running'
    returning id, recipient
),
line as (
    -- each completed job with the new head of its recipient's line as this statement
    -- sees it (the completed job still shows as running: it is left out by id)
    select d.id, d.recipient, h.due_at, h.status
    from d
    left join lateral (
        select j.due_at, j.status from jobs j
         where j.recipient = d.recipient and j.due_at is not null and j.id <> d.id
         order by coalesce(j.queued_at, j.run_at), j.id
         limit 1
    ) h on true
),
starts as (
    -- the pool's start order, recorded with its completions (starts_record); claimant
    -- NULL: nothing to record
    update worker_starts set started_upto = %(upto)s::bigint, updated_at = now()
     where id = %(claimant)s::bigint and started_upto < %(upto)s::bigint
),
sync as (
    select set_config('synchronous_commit',
                      case when %(durable)s then current_setting('synchronous_commit') else 'off' end, true)
)
-- idle: line_due, a recipient whose next job is not due yet (or who has none); not
-- behind another running job (its lease end is no run time)
select l.id, coalesce(l.due_at <= now(), false) as more,
       case when l.recipient is not null and (l.due_at is null or (l.status = 'pending' and l.due_at > now()))
            then l.recipient end as idle
from line l, sync;

-- name: retire_lines
-- Retire these recipients (complete_many's "idle") until the head of their line is due,
-- so the claim's walk, which takes recipients due now, skips them; NULL when nothing is
-- left. Its own statement, after the completion committed: it reads the lines anew (a
-- job enqueued since is seen), and it never waits. A row locked by someone else (the
-- intake's enqueue adding a job to the line, a claim) is skipped, as is a row that
-- changed since this statement's snapshot (ver: an enqueue it cannot see) or whose
-- head is running: retire_idle, the fetcher's sweep, gets what is left. So the intake
-- never waits for a retire longer than this statement's own run, and the retire never
-- waits for the intake's durable commit. Asynchronous commit: a retire lost in a crash
-- costs the claim's walk a probe until the sweep.
with idle as (
    select r.recipient, h.due_at
    from recipients seen
    left join lateral (
        select j.due_at, j.status from jobs j
         where j.recipient = seen.recipient and j.due_at is not null
         order by coalesce(j.queued_at, j.run_at), j.id
         limit 1
    ) h on true
    join recipients r on r.recipient = seen.recipient
    where seen.recipient = any (%(recipients)s::text[])
      and r.ver = seen.ver
      and (h.due_at is null or (h.status = 'pending' and h.due_at > now()))
      and r.next_due_at is distinct from h.due_at
    for update of r skip locked
),
sync as (
    select set_config('synchronous_commit', 'off', true)
)
update recipients r set next_due_at = i.due_at from idle i, sync where r.recipient = i.recipient;

-- name: settle_many
-- Every outcome of a run but "done", for many claims in one statement (the worker's
-- one outcome writer, autom/worker/completer.py), each fenced by its lease generation:
--   retry     back to pending at now + delay, the error recorded (the attempt counts)
--   failed    failed for good (the jobs_failed_alert trigger records its alert); with
--             unrun (the worker failed the claim without running it: attempts exhausted,
--             an at-most-once job lost) the claim's attempt is given back, so
--             attempts stays the runs started
--   released  back to pending at once, the attempt not counted (shutdown); run_at kept
--   deferred  back to pending at now + delay, the attempt not counted, no error (Defer);
--             but a refused deferral (Defer.refused: Telegram's 429) of a job that would
--             then still be deferred more than max_defer seconds (MAX_DEFER_SECONDS)
--             after its first refusal in a row (deferred_since, migrations/0018) fails
--             it for good instead ("expired": the attempt counts, the error says why)
--   cancelled ended for good without an alert (autom.errors.CancelJob: the chat blocked
--             the bot); the attempt counts, the error says why
-- A job that waits (retry, deferred) keeps its place in its recipient's order:
-- queued_at keeps the run_at it was first queued for (migrations/0006).
with u as (
    select * from unnest(%(ids)s::bigint[], %(leases)s::bigint[], %(outcomes)s::text[],
                         %(errors)s::text[], %(delays)s::float8[], %(refused)s::boolean[],
                         %(unrun)s::boolean[], %(tracebacks)s::text[], %(logs)s::text[])
                   as u (id, lease, outcome, error, delay, refused, unrun, traceback, log)
),
held as materialized (
    -- the recipients' rows locked in recipient order, and before any job row, as every
    -- writer of several recipients locks them (the intake's enqueue, migrations/0035) and
    -- in the claim's order (recipient, then job). Taken after the jobs (as the "free"
    -- update's join had it, then a walk after f), this statement and an intake batch
    -- storing deliveries for the same two chats could each hold one row and wait for the
    -- other's (issue 26); and a claim taking over a job whose lease ran out while its
    -- outcome was written here holds the recipient and waits for the job this statement
    -- held (tests/integration/test_settle_claim_deadlock.py): deadlocks, broken only
    -- after deadlock_timeout (1 s) by failing one. The jobs' recipients are read
    -- without locking them (a job's recipient never changes).
    select r.recipient from recipients r
     where r.recipient in (select j.recipient from jobs j where j.id = any (%(ids)s::bigint[]))
     order by r.recipient
       for no key update of r
),
t as (
    select u.id, u.lease, u.delay, u.refused, u.unrun, u.traceback, u.log::jsonb as log,
           case when x.expired then 'expired' else u.outcome end as outcome,
           case when x.expired then format('deferred for more than %%s s (MAX_DEFER_SECONDS): %%s',
                                           %(max_defer)s::float8, u.error)
                else u.error end as error
      -- after held: the count has every recipient locked before any job row is written
      from (select count(*) from held) k, u join jobs j on j.id = u.id
     cross join lateral (
         select u.outcome = 'deferred' and u.refused
                and coalesce(j.deferred_since, now()) + make_interval(secs => %(max_defer)s::float8)
                    < now() + make_interval(secs => u.delay) as expired
     ) x
),
f as (
    update jobs j
       set status = case when t.outcome in ('failed', 'expired') then 'failed'
                         when t.outcome = 'cancelled' then 'cancelled' else 'pending' end,
           attempts = case when t.outcome in ('released', 'deferred') or t.unrun then greatest(j.attempts - 1, 0)
                           else j.attempts end,
           queued_at = case when t.outcome in ('retry', 'deferred') then coalesce(j.queued_at, j.run_at)
                            else j.queued_at end,
           run_at = case when t.outcome in ('retry', 'deferred') then now() + make_interval(secs => t.delay)
                         else j.run_at end,
           last_error = case t.outcome when 'deferred' then j.last_error
                                       when 'released' then coalesce(t.error, j.last_error)
                                       else t.error end,
           -- a refused deferral starts the clock (or keeps it); a limiter's wait in
           -- between neither starts nor stops it; a retry (the job ran into something
           -- else) starts afresh
           deferred_since = case when t.outcome = 'deferred' and t.refused then coalesce(j.deferred_since, now())
                                 when t.outcome = 'retry' then null
                                 else j.deferred_since end,
           finished_at = case when t.outcome in ('failed', 'expired', 'cancelled') then now()
                              else j.finished_at end,
           -- the attempt's traceback and log (migrations/0028: the attempt triggers copy them)
           last_traceback = case when t.outcome = 'deferred' then j.last_traceback else t.traceback end,
           run_log = t.log,
           updated_at = now()
      from t
     where j.id = t.id and j.lease = t.lease and j.status = 'running'
    returning j.id, j.recipient, j.run_at, j.locked_until, j.status, j.last_error,
              coalesce(j.queued_at, j.run_at) as place
),
line as (
    -- when the recipient's line is due next (line_due, complete_many): the settled
    -- job keeps its place (queued_at), so while pending it is the head unless a job
    -- of an earlier place is in line; the statement still sees it as running, so the
    -- rest of the line is read without it
    select f.recipient, f.locked_until, f.status, f.run_at, r.ver,
           case when f.status = 'pending' and (h.id is null or (f.place, f.id) < (h.place, h.id))
                then f.run_at else h.due_at end as due_at,
           case when f.status = 'pending' and (h.id is null or (f.place, f.id) < (h.place, h.id))
                then 'pending' else h.status end as head_status
    from f
    join recipients r on r.recipient = f.recipient
    left join lateral (
        select j.id, j.due_at, j.status, coalesce(j.queued_at, j.run_at) as place from jobs j
         where j.recipient = f.recipient and j.due_at is not null and j.id <> f.id
         order by coalesce(j.queued_at, j.run_at), j.id
         limit 1
    ) h on true
),
free as (
    update recipients r
       set busy_until = case when r.busy_until = l.locked_until then null else r.busy_until end,
           next_due_at = case when r.ver <> l.ver or l.head_status = 'running'
                              -- as before line_due: at the latest when this job is due
                              then case when l.status = 'pending' then least(r.next_due_at, l.run_at)
                                        else r.next_due_at end
                              when l.due_at <= now() and r.next_due_at <= now() then r.next_due_at
                              else l.due_at end,
           ver = r.ver + 1
      from line l join held k on k.recipient = l.recipient where r.recipient = l.recipient
),
wake as (select pg_notify('autom_jobs', '') from f where f.status = 'pending' and f.run_at <= now() limit 1)
select f.id, f.status, f.run_at, f.last_error from f, (select count(*) from wake) w;

-- name: save_run_logs
-- The lines the handlers of claims just written done logged (ctx.log), kept on the job
-- row (migrations/0028), after their "done" (which clears an earlier attempt's); a
-- job claimed again since is left alone.
update jobs j set run_log = u.log::jsonb
  from unnest(%(ids)s::bigint[], %(leases)s::bigint[], %(logs)s::text[]) as u (id, lease, log)
 where j.id = u.id and j.lease = u.lease and j.status = 'done';

-- name: renew_many
-- Extend the leases this process holds; returns the claims still held (a missing
-- one was lost: its lease expired, whether or not another claim took the job yet). The
-- recipient stays busy at least as long as the lease. Committed durably: the worker
-- moves its local deadline on this answer (autom/jobs/store.py).
with held as materialized (
    -- the recipients' rows locked in recipient order, and before any job row (settle_many's
    -- held, the claim's order). Locked after the jobs' update (as they were), a claim taking
    -- over a job whose lease ran out just as this renewal read it as held could hold the
    -- recipient and wait for the job this statement held, and this statement wait for the
    -- recipient: a deadlock, broken after deadlock_timeout by failing one
    -- (tests/integration/test_settle_claim_deadlock.py). The jobs' recipients are read
    -- without locking them (a job's recipient never changes).
    select rc.recipient from recipients rc
     where rc.recipient in (select j.recipient from jobs j where j.id = any (%(ids)s::bigint[]))
     order by rc.recipient
       for no key update of rc
),
r as (
    update jobs j set locked_until = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
      -- after held: the count has every recipient locked before any job row is written
      from (select count(*) from held) k,
           (select * from unnest(%(ids)s::bigint[], %(leases)s::bigint[]) as t (id, lease)) t
     where j.id = t.id and j.lease = t.lease and j.status = 'running'
       -- a lease that ran out stays out: the job may be claimed again any moment, and
       -- this process already stopped the run at its local deadline (autom/worker)
       and j.locked_until > now()
    returning j.id, j.recipient, j.locked_until
),
busy as (
    update recipients rc set busy_until = greatest(rc.busy_until, r.locked_until)
      from r join held k on k.recipient = r.recipient where rc.recipient = r.recipient
)
select r.id, r.locked_until from r;

-- name: get_job
select id, kind, payload, status, attempts, max_attempts, run_at, locked_until, last_error, key,
       event_id, recipient, lease, created_at, updated_at, finished_at, trace,
       (select e.received_at from events e where e.id = jobs.event_id) as received_at
from jobs where id = %(id)s;

-- name: heartbeat_record
insert into service_state (name, value, updated_at)
values ('heartbeat', jsonb_build_object('job_id', %(job_id)s::bigint), now())
on conflict (name) do update set value = excluded.value, updated_at = excluded.updated_at;
