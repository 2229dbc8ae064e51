-- 0036: the reply's two functions plan once per connection, not at every call (issues 22/27).
--
-- A PL/pgSQL statement with arguments in it is planned from a cached plan source: five
-- "custom" plans (the arguments folded in as constants), then the generic plan if it is
-- estimated no dearer than the custom ones plus their planning. Two statements on the
-- webhook -> reply path never passed that test, so PostgreSQL planned them anew at every
-- call (callgrind of the backend, bench/RESULTS.md "The reply's two functions"):
--
-- * the hand-off's insert of the claimed job (0022, 0029): its max_attempts was
--   coalesce(the job's, (select ... from kinds ...), 8); with the job's known, a custom
--   plan drops the kinds sub-select, the generic plan keeps it, so custom won every time:
--   ~430,000 instructions (~40 %) of the hand-off's 1.7 million. Now the kind's
--   max_attempts is read in a statement of its own, and only when the job names none
--   (a SQL producer); the insert takes a plain variable.
-- * Telegram's take (0033) wrote the budget's row twice, each update with expressions of
--   the arguments (make_interval(secs => parts * global_interval)) that a custom plan
--   folds into constants: two plans at every send, ~200,000 instructions of its 900,000.
--   Now the row, locked at the start (select ... for update) as before, is computed in
--   the function and written once, with plain values (one row version and one WAL
--   record less for a send that goes at once).
--
-- And the take moved the next job of the sender's line (0026) with one update of jobs
-- whose where clause found that job: an update of jobs opens all of its indexes before
-- it looks for a row, ~100,000 instructions at every send, and most sends have no job
-- behind them. Now the next job is read first and updated only if there is one.
--
-- Together 2.58 million instructions of PostgreSQL for the hand-off and the take of one
-- reply before, ~1.76 million after (b288e25's: 1.42 million). Same results, same locks
-- (the budget's row is locked first, by the select, as before); the bodies are 0029's
-- and 0033's with those changes only.

create or replace function autom_intake_store_handoff(p_source text, p_headers jsonb, p_body text, p_dedup_key text,
                                           p_jobs jsonb, p_token uuid, p_lease_seconds float8)
returns table (event_id bigint, jobs_created bigint, id bigint, kind text, payload jsonb, attempts integer,
               max_attempts integer, lease bigint, locked_until timestamptz, recipient text, key text,
               run_at timestamptz, trace text)
language plpgsql volatile
as $$
#variable_conflict use_column
declare
    ev bigint;
    one record;
    ok boolean := false;
    made bigint := 0;
    handed jobs%rowtype;
    attempts_of int;
begin
    insert into events as e (source, headers, body, dedup_key)
    values (p_source, p_headers, p_body, p_dedup_key)
    on conflict (source, dedup_key) do nothing
    returning e.id into ev;
    if ev is null then  -- a redelivery: nothing stored, no row
        insert into intake_commits (token, results) values (p_token, jsonb_build_array(jsonb_build_array(1, null, 0)));
        return;
    end if;

    if jsonb_typeof(p_jobs) = 'array' and jsonb_array_length(p_jobs) = 1 then
        select t.kind, t.payload, t.key, t.recipient, coalesce(t.run_at, now()) as run_at, t.max_attempts, t.trace
          into one
          from jsonb_to_recordset(p_jobs) as t (kind text, payload jsonb, key text, recipient text,
                                                run_at timestamptz, max_attempts int, trace text);
        ok := one.run_at <= now()
              and not exists (select 1 from paused_kinds p where p.kind = one.kind)
              and (one.key is null or not exists (select 1 from jobs k where k.kind = one.kind and k.key = one.key));
        if ok and one.recipient is not null then
            -- lock the recipient's row (autom_enqueue's upsert, as its enqueue would)
            insert into recipients as r (recipient, next_due_at) values (one.recipient, one.run_at)
            on conflict (recipient) do update
                set next_due_at = least(r.next_due_at, excluded.next_due_at), ver = r.ver + 1;
            -- a new statement, a new snapshot: free by the claim's test, and an empty line
            select (r.busy_until is null or r.busy_until < now()
                    or coalesce((select b.status <> 'running' and b.locked_until = r.busy_until
                                   from jobs b where b.id = r.busy_job), false))
                   and not exists (select 1 from jobs l where l.recipient = one.recipient and l.due_at is not null)
              into ok
              from recipients r where r.recipient = one.recipient;
        end if;
        if ok then
            -- the earliest due time by jobs_due_all's first live entry, whatever the
            -- statistics (migrations/0025's head)
            ok := coalesce((select min(d.due_at) from jobs d where d.due_at is not null) > now(), true);
        end if;
    end if;

    if ok then
        attempts_of := one.max_attempts;
        if attempts_of is null then  -- the kind's when the job names none (SQL producers)
            attempts_of := coalesce((select k.max_attempts from kinds k where k.kind = one.kind), 8);
        end if;
        -- the claim's update of a due job (queries.sql, claim: claimed), made at insert;
        -- 0 is the lease a new job has (the column's default). autom_lease_next comes
        -- with migrations/0014 (a PL/pgSQL body finds functions when it runs)
        insert into jobs as j (kind, payload, key, recipient, run_at, max_attempts, event_id,
                               status, attempts, lease, locked_until, claimed_at, trace)
        values (one.kind, coalesce(one.payload, '{}'::jsonb), one.key, one.recipient, one.run_at,
                attempts_of, ev,
                'running', 1, autom_lease_next(0), now() + make_interval(secs => p_lease_seconds), now(), one.trace)
        on conflict (kind, key) where key is not null do nothing
        returning j.* into handed;
        if handed.id is not null then
            made := 1;
            if one.recipient is not null then
                -- the claim's mark
                update recipients r
                   set busy_until = handed.locked_until, busy_job = handed.id,
                       last_served = nextval('recipients_serve_seq')
                 where r.recipient = one.recipient;
            end if;
        end if;
    else
        select count(*) into made from autom_enqueue(p_jobs, ev);
    end if;

    insert into intake_commits (token, results) values (p_token, jsonb_build_array(jsonb_build_array(1, ev, made, handed.id, handed.lease)));
    return query select ev, made, handed.id, handed.kind, handed.payload, handed.attempts, handed.max_attempts,
                        handed.lease, handed.locked_until, handed.recipient, handed.key, handed.run_at, handed.trace;
end
$$;

-- autom_telegram_take as in 0033, the budget's row written once (above).
create or replace function autom_telegram_take(chat text, parts int, chat_interval float8, global_interval float8,
                                               burst float8, priority boolean, job bigint, line text,
                                               line_kinds text[], late float8,
                                               out wait float8, out reason text, out line_in float8)
language plpgsql volatile
as $$
declare
    t timestamptz := clock_timestamp();
    b telegram_budget%rowtype;
    chat_next timestamptz;
    reserve float8 := case when priority or burst < 2 then 0 else 1 end;
    held telegram_reservations%rowtype;
    slot timestamptz;
    budget_at timestamptz;
    taken boolean := false;
    moved int;
    decay float8;
    sent_at timestamptz;  -- when the sends made leave room for `parts` more (alerts: now)
    spent interval := make_interval(secs => parts * global_interval);  -- what `parts` sends take of the budget
    behind bigint;  -- the next job of the job's line
begin
    wait := 0;
    reason := null;
    if not priority and exists (select 1 from telegram_blocked k where k.chat_id = chat) then
        wait := -1;  -- the chat blocked the bot (migrations/0020): nothing is taken
        reason := 'blocked';
        return;
    end if;
    select * into b from telegram_budget for update;
    sent_at := case when priority then t
                    else b.sent_tat - make_interval(secs => (burst - parts) * global_interval) end;
    if job is not null then
        select * into held from telegram_reservations r where r.job_id = job and r.chat_id = chat for update;
        if found then
            if held.parts = parts and held.slot_at > t + interval '5 milliseconds' then
                wait := extract(epoch from held.slot_at - t);  -- back early (a capped deferral)
                reason := 'held';
                return;
            end if;
            delete from telegram_reservations r where r.job_id = job and r.chat_id = chat;
            -- its slot came (however long ago): the send is its own, nothing more is taken from
            -- the budget, when the sends made leave room for it now; else it takes the next slot
            taken := held.parts = parts and b.paused_until <= t and sent_at <= t + interval '1 millisecond';
        end if;
    end if;
    if not taken then
        select c.next_send_at into chat_next from telegram_chats c where c.chat_id = chat for update;
        slot := t;
        if b.paused_until > slot then
            slot := b.paused_until;
            reason := 'pause';
        end if;
        if chat_next is not null and chat_next > slot and not priority then
            slot := chat_next;
            reason := 'chat';
        end if;
        if not priority then
            -- GCRA: the slot at which `parts` more keep the spent budget within the burst
            budget_at := b.tat - make_interval(secs => (burst - reserve - parts) * global_interval);
            if budget_at > slot then
                slot := budget_at;
                reason := 'global';
            end if;
            if sent_at > slot then
                slot := sent_at;
                reason := 'sends';
            end if;
        end if;
        if slot > t + interval '1 millisecond' then
            wait := extract(epoch from slot - t);
            if job is null then
                return;  -- nothing to hold a slot for: wait, nothing taken
            end if;
        else
            slot := t;
            reason := null;
        end if;
        if reason = 'sends' then  -- the sends made hold it: the budget's burst is used up at its slot
            b.tat := greatest(b.tat, slot + make_interval(secs => (burst - reserve - parts) * global_interval))
                     + spent;
        else
            b.tat := greatest(b.tat, slot) + spent;
        end if;
        chat_next := slot + make_interval(secs => parts * chat_interval);
        insert into telegram_chats as c (chat_id, next_send_at)
        values (chat, chat_next)
        on conflict (chat_id) do update set next_send_at = excluded.next_send_at;
        if wait > 0 then
            insert into telegram_reservations (job_id, chat_id, slot_at, parts) values (job, chat, slot, parts)
            on conflict (job_id, chat_id) do update set slot_at = excluded.slot_at, parts = excluded.parts;
        end if;
    end if;
    if wait = 0 then  -- a send goes now: counted against the 429s (autom_telegram_pushed)
        decay := exp(-least(greatest(extract(epoch from t - b.flood_at), 0) / b.flood_memory, 50));
        b.flood_sent := b.flood_sent * decay + parts;
        b.flood_refused := b.flood_refused * decay;
        b.flood_at := t;
        b.sent_tat := greatest(b.sent_tat, t) + spent;
    end if;
    -- the budget's row, locked above, written once (its values computed here, so the
    -- statement's plan is generic: with expressions of the arguments in it, the planner
    -- folded them and planned it anew at every call)
    update telegram_budget
       set tat = b.tat, flood_sent = b.flood_sent, flood_refused = b.flood_refused, flood_at = b.flood_at,
           sent_tat = b.sent_tat;
    if line = chat and job is not null then
        if taken then  -- else chat_next is the chat's next slot, written above
            select c.next_send_at into chat_next from telegram_chats c where c.chat_id = chat;
        end if;
        -- the line's next job, read first: an update of jobs starts by opening every index
        -- of jobs, whether a row matches or not, and most sends have no job behind them
        select h.id into behind from jobs h
         where h.recipient = line and h.due_at is not null and h.id <> job
         order by coalesce(h.queued_at, h.run_at), h.id
         limit 1;
        if behind is not null then
            update jobs j set queued_at = coalesce(j.queued_at, j.run_at), run_at = chat_next, updated_at = t
             where j.id = behind and j.status = 'pending' and j.kind = any (line_kinds) and j.run_at < chat_next;
            get diagnostics moved = row_count;
        end if;
        if moved > 0 then
            line_in := extract(epoch from chat_next - t);
        end if;
    end if;
end
$$;
