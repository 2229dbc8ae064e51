-- Telegram's send limits (autom/limits.py, migrations/0009).

-- name: telegram_acquire
-- 0: the right to send %(parts)s messages to the chat now is taken; else seconds to wait.
-- Commits with synchronous_commit off, for its own transaction only (set_config(...,
-- true) lasts until this statement's commit): see SendLimiter.acquire for why.
select autom_telegram_acquire(%(chat)s, %(parts)s, %(chat_interval)s, %(global_interval)s,
                              %(burst)s, %(priority)s)
from (select set_config('synchronous_commit', 'off', true)) sync;

-- name: telegram_pushed
-- A 429 for the chat: hold it for %(after)s seconds; true when all sends pause.
select autom_telegram_pushed(%(chat)s, %(after)s, %(threshold)s, %(window)s);

-- name: prune_telegram_chats
-- Chats whose limit lies an hour behind behave exactly as chats never seen.
with gone as (
    select chat_id from telegram_chats where next_send_at < now() - interval '1 hour' limit %(batch)s
)
delete from telegram_chats c using gone where c.chat_id = gone.chat_id;
