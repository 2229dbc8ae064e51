-- 0024: a button press clears its chat's blocked mark, like any update from the chat.
-- A telegram.callback job's recipient is "<chat>:cb" (a line of its own beside the
-- chat's, autom/sources/telegram.py), so its chat is the recipient without ":cb".
create or replace function autom_telegram_chat_seen() returns trigger
language plpgsql as $$
declare
    chat text := case when new.kind = 'telegram.callback' then regexp_replace(new.recipient, ':cb$', '')
                      else new.recipient end;
begin
    if new.kind = 'telegram.member' and new.payload ->> 'status' = 'kicked' then
        insert into telegram_blocked (chat_id, reason)
        values (chat, 'my_chat_member: the bot was blocked (status kicked)')
        on conflict (chat_id) do update set blocked_at = now(), reason = excluded.reason;
    elsif new.kind <> 'telegram.member' or new.payload ->> 'status' is distinct from 'left' then
        delete from telegram_blocked where chat_id = chat;
    end if;
    return null;
end
$$;
