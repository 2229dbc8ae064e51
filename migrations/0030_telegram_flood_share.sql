-- 0030: Telegram's limits (autom/limits.py): a flood is judged against the sends made, and
-- a reserved slot is kept however late its job comes back for it.
--
-- The flood rule. Telegram answers 429 with retry_after, "the number of seconds left to
-- wait before the request can be repeated": a refusal of that request, to that chat. It
-- documents no bot-wide pause; the bot-wide limit (about 30 a second) shows as most sends
-- being refused at once. Before, three 429s within 10 s (from any chats) paused every
-- send: at 30 sends a second, one send in a hundred refused already fired it. In the
-- rate-30 soak (a stub refusing 6 % of sends at random) it paused all sends 140 times in
-- four minutes, and each pause moved every reserved slot and the bot's budget past it:
-- slots were handed out 72 s ahead and the bot sent 11.7 a second against 30
-- (bench/RESULTS.md). Now all sends pause only when three 429s came within 10 s AND the
-- recent 429s are at least `flood_share` (a half) of the recent sends: both counted
-- with a weight that decays by e every `flood_memory` (5) seconds, kept in the budget
-- row. A random few refusals hold their own chats only (as before); Telegram refusing
-- most sends pauses them all within a few seconds (from one send a second up).
--
-- Late reservations. A job that comes back for its slot after it (the workers lagged:
-- slow answers, an outage) used to give it up when more than `late` seconds had passed
-- and take a new one at the end of the budget: the old slot's budget wasted, the job
-- put behind every later one, and while the workers kept lagging it was late again (a
-- second claim, a second slot, the budget running ahead of the sends). Now the slot is
-- its own whenever it comes: it sends at once and takes nothing more. Its slot's budget
-- was spent when it was handed out, so the sends keep to the budget's count; only a
-- catch-up after an outage can go faster than the budget for a moment, at the workers'
-- pace (a 429 then holds that chat, and if most sends are refused all sends pause).
-- `late` stays in the signature (unused) so that a replica of the version before keeps
-- working during an upgrade.

alter table telegram_budget
    add column flood_sent    float8      not null default 0,        -- sends, decayed (flood_memory)
    add column flood_refused float8      not null default 0,        -- 429s, decayed the same way
    add column flood_at      timestamptz not null default 'epoch',  -- when the two were last decayed
    add column flood_share   float8      not null default 0.5,      -- 429s / sends that mean a flood
    add column flood_memory  float8      not null default 5.0;      -- seconds: the decay's time constant

-- autom_telegram_take as in 0026, but: a reservation is used however late (see above),
-- and every send that goes now is counted in flood_sent.
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
begin
    wait := 0;
    reason := null;
    if not priority and exists (select 1 from telegram_blocked k where k.chat_id = chat) then
        wait := -1;  -- the chat blocked the bot (migrations/0020): nothing is taken
        reason := 'blocked';
        return;
    end if;
    select * into b from telegram_budget for update;
    if job is not null then
        select * into held from telegram_reservations r where r.job_id = job and r.chat_id = chat for update;
        if found then
            if held.parts = parts and held.slot_at > t + interval '5 milliseconds' then
                wait := extract(epoch from held.slot_at - t);  -- back early (a capped deferral)
                reason := 'held';
                return;
            end if;
            delete from telegram_reservations r where r.job_id = job and r.chat_id = chat;
            -- its slot came (however long ago): the send is its own, nothing more is taken
            taken := held.parts = parts and b.paused_until <= t;
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
        update telegram_budget set tat = greatest(tat, slot) + make_interval(secs => parts * global_interval);
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
                                   flood_at = t;
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

-- autom_telegram_pushed as in 0026, but all sends pause only when `flood_threshold` 429s
-- came within `flood_window` seconds and the recent 429s are at least flood_share of the
-- recent sends (the budget row's decayed counts, see above).
create or replace function autom_telegram_pushed(chat text, after float8, flood_threshold int, flood_window float8)
returns boolean
language plpgsql volatile
as $$
declare
    t timestamptz := clock_timestamp();
    paused boolean;
    until timestamptz := t + make_interval(secs => after);
    first timestamptz;
    shift interval;
begin
    select min(r.slot_at) into first from telegram_reservations r where r.chat_id = chat;
    shift := case when first is not null and first < until then until - first else interval '0' end;
    if shift > interval '0' then
        with moved as (
            update telegram_reservations r set slot_at = r.slot_at + shift where r.chat_id = chat returning r.job_id
        )
        update jobs j set queued_at = coalesce(j.queued_at, j.run_at), run_at = j.run_at + shift, updated_at = t
          from moved where j.id = moved.job_id and j.status = 'pending';
    end if;
    insert into telegram_chats as c (chat_id, next_send_at)
    values (chat, until)
    on conflict (chat_id) do update set next_send_at = greatest(c.next_send_at + shift, excluded.next_send_at);
    update telegram_budget
       set flood_count = case when flood_since > t - make_interval(secs => flood_window)
                              then flood_count + 1 else 1 end,
           flood_since = case when flood_since > t - make_interval(secs => flood_window)
                              then flood_since else t end,
           flood_sent = flood_sent * exp(-least(greatest(extract(epoch from t - flood_at), 0) / flood_memory, 50)),
           flood_refused = flood_refused
                           * exp(-least(greatest(extract(epoch from t - flood_at), 0) / flood_memory, 50)) + 1,
           flood_at = t
    returning flood_count >= flood_threshold and flood_refused >= flood_share * flood_sent into paused;
    if paused then
        select min(r.slot_at) into first from telegram_reservations r;
        shift := case when first is not null and first < until then until - first else interval '0' end;
        if shift > interval '0' then
            with moved as (
                update telegram_reservations r set slot_at = r.slot_at + shift returning r.job_id
            )
            update jobs j set queued_at = coalesce(j.queued_at, j.run_at), run_at = j.run_at + shift,
                              updated_at = t
              from moved where j.id = moved.job_id and j.status = 'pending';
        end if;
        update telegram_budget set paused_until = greatest(paused_until, until),
                                   tat = greatest(tat, t) + shift;
    end if;
    return paused;
end
$$;
