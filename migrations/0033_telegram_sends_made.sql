-- 0033: Telegram's limits (autom/limits.py): the bot's rate bounds the sends actually made.
--
-- The budget (telegram_budget.tat, a GCRA) hands out slots; a job that comes back after
-- its slot, however late, sends on it (0030). That keeps to the budget only while the
-- workers come back on time. When they fall behind (a stalled database, a starved
-- process) and then catch up, the late slots go out at the workers' pace beside the slots
-- coming due: the rate-30 soak sent 33-37 messages a second over 30-s stretches while its
-- workers caught up (bench/RESULTS.md), and Telegram counts the sends it receives, not
-- the slots we handed out. Now a second GCRA, sent_tat, counts the sends actually made
-- (bursts of at most `burst`, TELEGRAM_GLOBAL_RATE a second), and every send but an
-- alert's goes now only when it has room: a job back for its slot (on time or late), or
-- a send the budget allows at once. A send it refuses takes the next slot, as a send
-- that must wait always did (behind the slots handed out already: the bot is sending all
-- it may), reason 'sends'. Workers that lag steadily send at the slots' pace and are
-- never refused; only a catch-up is, one more claim for each job it holds back.
-- Alerts are charged, never held (as with the budget). The refusal's slot also uses up
-- the budget's burst (tat moves to it plus the burst), so that the sends it refuses
-- are spread one interval apart, not all given the one moment the sends made have room.

alter table telegram_budget
    add column sent_tat timestamptz not null default '-infinity';  -- GCRA of the sends actually made

-- autom_telegram_take as in 0030, but for the sends made (above).
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
            update telegram_budget
               set tat = greatest(tat, slot + make_interval(secs => (burst - reserve - parts) * global_interval))
                         + make_interval(secs => parts * global_interval);
        else
            update telegram_budget set tat = greatest(tat, slot) + make_interval(secs => parts * global_interval);
        end if;
        insert into telegram_chats as c (chat_id, next_send_at)
        values (chat, slot + make_interval(secs => parts * chat_interval))
        on conflict (chat_id) do update set next_send_at = excluded.next_send_at;
        if wait > 0 then
            insert into telegram_reservations (job_id, chat_id, slot_at, parts) values (job, chat, slot, parts)
            on conflict (job_id, chat_id) do update set slot_at = excluded.slot_at, parts = excluded.parts;
        end if;
    end if;
    if wait = 0 then  -- a send goes now: counted against the 429s (autom_telegram_pushed)
        decay := exp(-least(greatest(extract(epoch from t - b.flood_at), 0) / b.flood_memory, 50));
        update telegram_budget set flood_sent = flood_sent * decay + parts, flood_refused = flood_refused * decay,
                                   flood_at = t,
                                   sent_tat = greatest(sent_tat, t) + make_interval(secs => parts * global_interval);
    end if;
    if line = chat and job is not null then
        select c.next_send_at into chat_next from telegram_chats c where c.chat_id = chat;
        update jobs j set queued_at = coalesce(j.queued_at, j.run_at), run_at = chat_next, updated_at = t
         where j.id = (select h.id from jobs h
                        where h.recipient = line and h.due_at is not null and h.id <> job
                        order by coalesce(h.queued_at, h.run_at), h.id
                        limit 1)
           and j.status = 'pending' and j.kind = any (line_kinds) and j.run_at < chat_next;
        get diagnostics moved = row_count;
        if moved > 0 then
            line_in := extract(epoch from chat_next - t);
        end if;
    end if;
end
$$;
