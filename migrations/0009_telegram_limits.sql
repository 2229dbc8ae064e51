-- 0009: Telegram's send limits, shared by every replica (autom/limits.py).
--
-- Telegram allows about one message a second per chat, twenty a minute per group and
-- about thirty a second per bot, and answers more with 429 (research/admission.md §2).
-- A limiter per process would let N replicas send N times that, so the state lives
-- here: one row per chat with the earliest time its next message may go, and one row
-- for the bot's whole budget (a GCRA "theoretical arrival time", plus a pause when
-- many chats were answered 429 at once). A send that must wait is not slept on: the
-- job is deferred (autom.errors.Defer) and runs again when its turn comes.

create table telegram_chats (
    chat_id      text primary key,
    next_send_at timestamptz not null          -- no message to this chat before this
);
create index telegram_chats_next_send_at on telegram_chats (next_send_at);

create table telegram_budget (
    one          boolean primary key default true check (one),   -- exactly one row
    tat          timestamptz not null default '-infinity',        -- GCRA: the budget is spent up to here
    paused_until timestamptz not null default '-infinity',        -- no sends before this (a 429 flood)
    flood_since  timestamptz not null default '-infinity',        -- start of the current 429 window
    flood_count  integer     not null default 0                   -- 429s seen in that window
);
insert into telegram_budget default values;

-- Take the right to send `parts` messages to `chat` now, or say how long to wait.
-- Returns 0 when taken (the chat's next send moves `parts` chat intervals ahead and
-- the budget is spent), else the seconds until both the chat and the budget allow it
-- (nothing is taken then). The budget row is locked for the statement: every send of
-- every replica passes here one at a time, a few microseconds each.
--   chat_interval    seconds between two messages to this chat (groups: at least 3)
--   global_interval  1 / TELEGRAM_GLOBAL_RATE
--   burst            sends the budget may take at once (at most the rate)
--   priority         alerts: may also take the last slot of the burst, kept free for them, and
--                    do not wait for their chat's spacing (the alert sender's own throttle,
--                    a few a minute, spaces them; it also waits out a 429 itself)
create function autom_telegram_acquire(chat text, parts int, chat_interval float8, global_interval float8,
                                       burst float8, priority boolean)
returns float8
language plpgsql volatile
as $$
declare
    t timestamptz := clock_timestamp();
    b telegram_budget%rowtype;
    chat_next timestamptz;
    reserve float8 := case when priority or burst < 2 then 0 else 1 end;
    start timestamptz;
    wait float8 := 0;
begin
    select * into b from telegram_budget for update;
    if b.paused_until > t then
        wait := extract(epoch from b.paused_until - t);
    end if;
    select c.next_send_at into chat_next from telegram_chats c where c.chat_id = chat for update;
    if chat_next is not null and chat_next > t and not priority then
        wait := greatest(wait, extract(epoch from chat_next - t));
    end if;
    -- GCRA: taking `parts` more is allowed while the spent budget stays within the burst
    start := greatest(b.tat, t);
    wait := greatest(wait, extract(epoch from start - t) + (parts - 1 - (burst - 1 - reserve)) * global_interval);
    if wait > 0.000001 then
        return wait;
    end if;
    update telegram_budget set tat = start + make_interval(secs => parts * global_interval);
    insert into telegram_chats as c (chat_id, next_send_at)
    values (chat, t + make_interval(secs => parts * chat_interval))
    on conflict (chat_id) do update set next_send_at = excluded.next_send_at;
    return 0;
end
$$;

-- Telegram answered `chat` with 429 and retry_after `after`: no message to it for that
-- long. `flood_threshold` 429s within `flood_window` seconds (from any chats) pause
-- every send for the longest retry_after among them. Returns whether all sends pause.
create function autom_telegram_pushed(chat text, after float8, flood_threshold int, flood_window float8)
returns boolean
language plpgsql volatile
as $$
declare
    t timestamptz := clock_timestamp();
    paused boolean;
begin
    insert into telegram_chats as c (chat_id, next_send_at)
    values (chat, t + make_interval(secs => after))
    on conflict (chat_id) do update set next_send_at = greatest(c.next_send_at, excluded.next_send_at);
    update telegram_budget
       set flood_count = case when flood_since > t - make_interval(secs => flood_window)
                              then flood_count + 1 else 1 end,
           flood_since = case when flood_since > t - make_interval(secs => flood_window)
                              then flood_since else t end
    returning flood_count >= flood_threshold into paused;
    if paused then
        update telegram_budget set paused_until = greatest(paused_until, t + make_interval(secs => after));
    end if;
    return paused;
end
$$;
