-- 0020: Telegram. Each part of a split text is sent once, and chats that blocked the bot.

-- The parts of split texts a job has sent (autom/telegram.py): an object whose keys
-- name one split send of the job's handler ("<n>:<digest>": its n-th split send in a
-- run, and a digest of chat, text and parameters) and whose values are [parts sent,
-- message_id of the last one]. Written after each part, fenced by the claim's lease
-- (telegram_parts_record), read by the job's next run to resume at the first part not
-- sent. NULL for every job that never sent a split text: nullable, no default, no
-- table rewrite; it goes with its job.
alter table jobs add column telegram_parts jsonb;

-- Chats that blocked the bot (a 403 "bot was blocked by the user", "user is
-- deactivated", "bot was kicked from ..."; or a my_chat_member update whose new
-- status is "kicked"). A send to such a chat is cancelled without calling Telegram
-- (telegram_acquire). The mark goes when an update from the chat arrives again
-- (the trigger below). No foreign key: a chat is not a recipient row (those are
-- pruned when idle).
create table telegram_blocked (
    chat_id    text primary key,
    blocked_at timestamptz not null default now(),
    reason     text not null
);

-- The intake clears the mark when the telegram source makes a job of an update from
-- the chat, and a my_chat_member update ("telegram.member") sets it when the bot's
-- new status is "kicked" ("left" changes nothing). In the statement that stores the
-- update, so the job it made never finds its chat still marked. WHEN is checked per
-- row without calling the function: only jobs the telegram source makes (an event's,
-- with a chat) call it; a replayed update clears the mark too.
create function autom_telegram_chat_seen() returns trigger
language plpgsql as $$
begin
    if new.kind = 'telegram.member' and new.payload ->> 'status' = 'kicked' then
        insert into telegram_blocked (chat_id, reason)
        values (new.recipient, 'my_chat_member: the bot was blocked (status kicked)')
        on conflict (chat_id) do update set blocked_at = now(), reason = excluded.reason;
    elsif new.kind <> 'telegram.member' or new.payload ->> 'status' is distinct from 'left' then
        delete from telegram_blocked where chat_id = new.recipient;
    end if;
    return null;
end
$$;

create trigger jobs_telegram_chat_seen
    after insert on jobs
    for each row
    when (new.event_id is not null and new.recipient is not null
          and new.kind in ('telegram.message', 'telegram.member', 'telegram.callback', 'telegram.edited'))
    execute function autom_telegram_chat_seen();

-- A run can now end 'cancelled' (autom.errors.CancelJob: the chat blocked the bot);
-- the attempt log records it. A trigger of its own beside jobs_attempt_log
-- (migrations/0008), which it leaves as it is.
alter table job_attempts drop constraint job_attempts_outcome_check;
alter table job_attempts add constraint job_attempts_outcome_check
    check (outcome in ('retry', 'failed', 'lease_expired', 'cancelled'));

create function autom_record_cancelled_attempt() returns trigger
language plpgsql as $$
begin
    insert into job_attempts (job_id, attempt, started_at, outcome, error)
    values (old.id, old.attempts, old.claimed_at, 'cancelled', new.last_error);
    return null;
end
$$;

create trigger jobs_attempt_cancelled
    after update of status on jobs
    for each row
    when (old.status = 'running' and new.status = 'cancelled')
    execute function autom_record_cancelled_attempt();
