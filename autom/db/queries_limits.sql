-- Telegram's send limits (autom/limits.py, migrations/0009).

-- name: telegram_acquire
-- wait 0: the right to send %(parts)s messages to the chat now is taken; wait > 0: the
-- job %(job)s's slot is reserved that many seconds ahead (no job: nothing taken), and
-- reason says what held it (chat, global, sends, pause, held); a job back after its slot, however
-- late, sends on it when the sends made leave room, else takes the next slot (migrations/0033;
-- the last argument, `late`, is unused since migrations/0030); line_in: the chat's next job of the
-- job's line was moved to the chat's next slot, due in that many seconds; -1: the chat blocked the bot
-- (migrations/0020, 0026). Commits with synchronous_commit off, for its own transaction
-- only (set_config(..., true) lasts until this statement's commit): see
-- SendLimiter.acquire for why.
select t.wait, t.reason, t.line_in
from (select set_config('synchronous_commit', 'off', true)) sync,
     autom_telegram_take(%(chat)s, %(parts)s, %(chat_interval)s, %(global_interval)s, %(burst)s, %(priority)s,
                         %(job)s, %(line)s, %(line_kinds)s::text[], null) t;

-- name: telegram_chat_space
-- An alert's turn in its chat (alerts skip the spacing in telegram_acquire, and keep to
-- it here, so that every replica's alerts together keep to a group's 20 a minute):
-- 0 when the chat's spacing allows a message now (its next one then %(interval)s
-- seconds later), else the seconds to wait (nothing taken). A concurrent take waits
-- for this one's row lock and re-checks, so of two replicas one takes the turn.
with now as (select clock_timestamp() as t),
took as (
    insert into telegram_chats as c (chat_id, next_send_at)
    select %(chat)s, now.t + make_interval(secs => %(interval)s) from now
    on conflict (chat_id) do update set next_send_at = excluded.next_send_at
        where c.next_send_at <= (select t from now)
    returning 1
)
-- Not taken and the chat looks free (or unknown) in this statement's snapshot: another
-- replica took the turn just now (its commit came after the snapshot): a whole interval.
select case when exists (select 1 from took) then 0
            else coalesce((select extract(epoch from c.next_send_at - now.t)
                             from telegram_chats c, now where c.chat_id = %(chat)s and c.next_send_at > now.t),
                          %(interval)s) end;

-- name: telegram_sent
-- A message to the chat was sent and answered: its next one no sooner than %(interval)s
-- seconds from now (SendLimiter.sent; migrations/0038), and the next job of the sending
-- job's line (%(line)s, when it is the chat: the take moved it to the chat's next slot,
-- counted from the take) no sooner either, so that it is not claimed only to wait those
-- few milliseconds more. Returns in how many seconds that job is due (no row: none moved).
-- Commits without waiting for the disk, as the take does.
with sync as (select set_config('synchronous_commit', 'off', true)),
chat as (
    update telegram_chats c
       set sent_next_at = greatest(c.sent_next_at, clock_timestamp() + make_interval(secs => %(interval)s))
      from sync
     where c.chat_id = %(chat)s
    returning c.sent_next_at
),
behind as (
    select h.id from jobs h
     where h.recipient = %(line)s and %(line)s = %(chat)s and h.due_at is not null and h.id <> %(job)s::bigint
     order by coalesce(h.queued_at, h.run_at), h.id
     limit 1
),
moved as (
    update jobs j set queued_at = coalesce(j.queued_at, j.run_at), run_at = chat.sent_next_at, updated_at = now()
      from chat, behind
     where j.id = behind.id and j.status = 'pending' and j.kind = any (%(line_kinds)s::text[])
       and j.run_at < chat.sent_next_at
    returning j.run_at
)
select extract(epoch from moved.run_at - clock_timestamp())::float8 as line_in from moved;

-- name: telegram_pushed
-- A 429 for the chat: hold it for %(after)s seconds; true when all sends pause.
select autom_telegram_pushed(%(chat)s, %(after)s, %(threshold)s, %(window)s);

-- name: prune_telegram_chats
-- Chats whose limit lies an hour behind behave exactly as chats never seen (their
-- last send made, sent_next_at, included: migrations/0038).
with gone as (
    select chat_id from telegram_chats
     where next_send_at < now() - interval '1 hour'
       and (sent_next_at is null or sent_next_at < now() - interval '1 hour')
     limit %(batch)s
)
delete from telegram_chats c using gone where c.chat_id = gone.chat_id;

-- name: prune_telegram_reservations
-- Reservations an hour past their slot: their job ended (or was cancelled) before it
-- came back for them.
delete from telegram_reservations where (job_id, chat_id) in (
    select job_id, chat_id from telegram_reservations where slot_at < now() - interval '1 hour' limit %(batch)s
);

-- name: telegram_block
-- The chat blocked the bot (Telegram answered 403): mark it, and cancel its other
-- pending jobs of the kinds in %(kinds)s (its recipient's; not %(job_id)s, the job that
-- found out). Cancelled jobs raise no alert. Their recipient's line may run its next job
-- now (as ops_cancel_job). Returns how many were cancelled.
with mark as (
    insert into telegram_blocked (chat_id, reason) values (%(chat)s, %(reason)s)
    on conflict (chat_id) do update set blocked_at = now(), reason = excluded.reason
),
c as (
    update jobs set status = 'cancelled', finished_at = now(), locked_until = null, updated_at = now(),
                    last_error = %(error)s
     where recipient = %(chat)s and due_at is not null and status = 'pending'
       and kind = any (%(kinds)s::text[]) and id <> %(job_id)s
    returning recipient
),
line as (
    update recipients r set next_due_at = least(r.next_due_at, now()), ver = r.ver + 1
     where r.recipient = %(chat)s and exists (select 1 from c)
)
select count(*) from c;

-- name: telegram_blocked_chat
-- The chat's blocked mark: when and why, or no row.
select chat_id, blocked_at, reason from telegram_blocked where chat_id = %(chat)s;

-- name: telegram_blocked_chats
-- Every chat marked blocked, the latest first.
select chat_id, blocked_at, reason from telegram_blocked order by blocked_at desc, chat_id limit %(limit)s;

-- name: telegram_parts_sent
-- How far the job's split send %(slot)s got: [parts sent, last message_id], or NULL.
select telegram_parts -> %(slot)s as sent from jobs where id = %(job_id)s;

-- name: telegram_parts_record
-- The split send %(slot)s has sent %(sent)s parts, the last %(message_id)s: recorded
-- only while this claim holds the job (lease); no row: the claim was lost, nothing written.
update jobs set telegram_parts = coalesce(telegram_parts, '{}'::jsonb)
                                 || jsonb_build_object(%(slot)s::text, jsonb_build_array(%(sent)s::int, %(message_id)s::bigint))
 where id = %(job_id)s and lease = %(lease)s and status = 'running'
returning id;
