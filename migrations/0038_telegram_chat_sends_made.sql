-- 0038: a chat's next message keeps its interval from the chat's last send actually made.
--
-- The limiter reserves each chat's slots one interval apart (0026), and a job back after
-- its slot, however late, sends on it (0030, 0033). When the workers lag (a saturated
-- process: bench/RESULTS.md, issue 27's sustained run at 366 deliveries/s), a slot's send
-- can go late while the chat's next reserved slot is kept: the two messages then reach
-- Telegram closer than the chat's interval, and a strict per-chat limit answers 429 (one
-- in ten minutes there). Now each send made records when the chat may have its next one
-- (telegram_chats.sent_next_at: the send's moment plus its parts' interval), and a send,
-- reserved or new, goes no sooner: a reserved slot that comes back too soon after the
-- chat's last send waits the rest of the interval, keeping its slot (its budget was paid);
-- a new slot is taken no sooner than that moment either. Telegram's answer to a send
-- moves it again (queries_limits.sql, telegram_sent: the answer comes after the message
-- arrived, and a busy process makes the send some milliseconds after its take). Alerts
-- (priority) keep to their own spacing (telegram_chat_space); the take records them too.
alter table telegram_chats add column sent_next_at timestamptz;

-- autom_telegram_take as in 0036, with the chat's sends made (above).
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
    chat_sent timestamptz;  -- the chat's next message may go from here, by the sends made (0038)
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
            -- a slot that came late (its worker lagged) may fall within the chat's interval of
            -- the chat's last send, itself late: it waits for the interval, keeping its slot
            select c.sent_next_at into chat_sent from telegram_chats c where c.chat_id = chat for update;
            if held.parts = parts and chat_sent > t + interval '1 millisecond' then
                update telegram_reservations r set slot_at = chat_sent where r.job_id = job and r.chat_id = chat;
                wait := extract(epoch from chat_sent - t);
                reason := 'chat';
                return;
            end if;
            delete from telegram_reservations r where r.job_id = job and r.chat_id = chat;
            -- its slot came (however long ago): the send is its own, nothing more is taken from
            -- the budget, when the sends made leave room for it now; else it takes the next slot
            taken := held.parts = parts and b.paused_until <= t and sent_at <= t + interval '1 millisecond';
        end if;
    end if;
    if not taken then
        select c.next_send_at, c.sent_next_at into chat_next, chat_sent
          from telegram_chats c where c.chat_id = chat for update;
        slot := t;
        if b.paused_until > slot then
            slot := b.paused_until;
            reason := 'pause';
        end if;
        if chat_next is not null and chat_next > slot and not priority then
            slot := chat_next;
            reason := 'chat';
        end if;
        -- the chat's last send went late (after its slot): keep its interval from that send
        if chat_sent is not null and chat_sent > slot and not priority then
            slot := chat_sent;
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
        -- a send that goes now (slot = t) also records the chat's next send by the sends
        -- made, in the same row version
        insert into telegram_chats as c (chat_id, next_send_at, sent_next_at)
        values (chat, chat_next, case when wait = 0 then chat_next end)
        on conflict (chat_id) do update
            set next_send_at = excluded.next_send_at,
                sent_next_at = coalesce(excluded.sent_next_at, c.sent_next_at);
        if wait > 0 then
            insert into telegram_reservations (job_id, chat_id, slot_at, parts) values (job, chat, slot, parts)
            on conflict (job_id, chat_id) do update set slot_at = excluded.slot_at, parts = excluded.parts;
        end if;
    end if;
    if wait = 0 then  -- a send goes now: counted against the 429s (autom_telegram_pushed)
        if taken then  -- on its reserved slot: the chat's next send by the sends made (a new
                       -- slot's send wrote it with the chat's row above)
            insert into telegram_chats as c (chat_id, next_send_at, sent_next_at)
            values (chat, t + make_interval(secs => parts * chat_interval), t + make_interval(secs => parts * chat_interval))
            on conflict (chat_id) do update set sent_next_at = excluded.sent_next_at;
        end if;
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
