-- 0026: a send that must wait for Telegram's limits takes its slot at once (autom/limits.py).
--
-- Before, a job whose send had to wait took nothing and was deferred, claimed again,
-- found the limit still taken by others, deferred again: about 100 claims per job in
-- a soak at the bot's global rate (bench/RESULTS.md). Now the limiter hands out the
-- next slot the chat, the group and the bot's budget allow, records it here for the
-- job, and the job is deferred to exactly that slot: when it comes back the slot is
-- its own and the send goes out without another wait. The job's recipient line (the
-- chat's next job of a kind that talks to the chat) is moved to the chat's next slot
-- as a send takes its own, so it is claimed when it can send, not before. A 429 moves
-- the chat's reservations (and their jobs) past its retry_after; a pause of all sends
-- moves every reservation past the pause.

create table telegram_reservations (
    job_id  bigint      not null,
    chat_id text        not null,
    slot_at timestamptz not null,   -- the job's send to this chat goes at this time
    parts   int         not null,
    primary key (job_id, chat_id)
);
create index telegram_reservations_slot_at on telegram_reservations (slot_at);
create index telegram_reservations_chat on telegram_reservations (chat_id, slot_at);

-- Take the right to send `parts` messages to `chat` (-1, 'blocked': the chat blocked the
-- bot, nothing taken; alerts, `priority`, are not checked): now (returns wait 0), or for the job
-- `job` at its reserved slot (returns the seconds until it, and the reason: 'chat' its
-- spacing or a 429's hold, 'global' the bot's budget, 'pause' all sends paused, 'held'
-- the job came back before its slot). Without a job (alerts) nothing is reserved: the
-- wait is returned and nothing taken. `late`: a reservation used more than this many
-- seconds after its slot is dropped and a new slot taken (the job was held up long).
-- `line`, `line_kinds`: the job's recipient; when it is the chat, the next job of its
-- line of one of those kinds is moved to the chat's next slot (its place kept); line_in
-- says in how many seconds it is due then (else NULL).
-- Priority (alerts) keeps to a pause only, not to its chat's spacing (the alert sender
-- spaces its messages) nor to the budget's wait (the budget is still charged, so later
-- slots make up for it).
create function autom_telegram_take(chat text, parts int, chat_interval float8, global_interval float8,
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
            taken := held.parts = parts and held.slot_at >= t - make_interval(secs => late)
                     and b.paused_until <= t;
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

-- A 429 for `chat` (retry_after `after`): as in 0009, and the chat's reservations (and
-- their pending jobs) move past the hold, keeping their spacing; when all sends pause,
-- every reservation (and the budget) moves past the pause.
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
                              then flood_since else t end
    returning flood_count >= flood_threshold into paused;
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
