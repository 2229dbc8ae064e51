-- 0027: a paused recipient, and a recipient's story read fast.
--
-- An operator pauses a recipient (a suspended customer, a chat that misbehaves): its
-- jobs stay pending in every replica and count in no claim until it is resumed. The
-- claim's recipients lane skips a row whose paused_at is set (one column test on the
-- row it walks anyway); prune_recipients keeps such a row even with nothing queued,
-- so the pause outlives an empty line.
alter table recipients add column paused_at timestamptz;

-- The recipient's page (/ui/recipients/{r}, GET /admin/recipients/{r}) pages through
-- its jobs newest first: an index walk of one recipient's ids at any table size
-- (jobs_recipient_line holds only unfinished jobs).
create index jobs_recipient_id on jobs (recipient, id) where recipient is not null;
