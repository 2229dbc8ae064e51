-- 0034: the console's recipient index holds each job once (issues 22/27).
--
-- jobs_recipient_id (0027: every job of a recipient by id) took an entry for every row
-- version of a recipient's job: enqueue, claim and completion are non-HOT updates, so
-- the recipient lane paid ~20 µs of PostgreSQL CPU a job for it (bench/RESULTS.md).
-- Now it holds finished jobs only (done, failed, cancelled: due_at NULL, for good), one
-- entry a job, written when the job finishes. A recipient's unfinished jobs are in its
-- line (jobs_recipient_line, 0006; the intake keeps it near MAX_PENDING_PER_RECIPIENT);
-- the recipient's page and the jobs list filtered by a recipient read both, the finished
-- walked newest first and stopped at the page, the line read whole and sorted
-- (ops_recipient_timeline, ops_list_jobs; the failed lists and purge say due_at too).
create index jobs_recipient_done on jobs (recipient, id) where recipient is not null and due_at is null;
drop index jobs_recipient_id;
