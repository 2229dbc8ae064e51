-- Admission's queries (autom/admission.py): the backlog estimate and recipient caps.

-- name: admission_backlog
-- Unfinished jobs (pending, also scheduled later, and running: due_at is set exactly
-- for those), counted no further than %(limit)s so a huge backlog costs a bounded
-- scan (jobs_due_all, an index-only scan once the visibility map is set).
select count(*) from (select 1 from jobs where due_at is not null limit %(limit)s) unfinished;

-- name: admission_warm_recipients
-- Recipients with at least %(floor)s unfinished jobs: only deliveries to these are
-- checked one by one against MAX_PENDING_PER_RECIPIENT. Run only when the whole
-- backlog reaches %(floor)s (otherwise no recipient can).
select recipient, count(*) as n
from jobs
where recipient is not null and due_at is not null
group by recipient
having count(*) >= %(floor)s
order by n desc
limit %(limit)s;

-- name: admission_recipient_unfinished
-- One recipient's unfinished jobs, counted no further than the cap (jobs_recipient_head).
select count(*) from (
    select 1 from jobs where recipient = %(recipient)s and due_at is not null limit %(cap)s
) unfinished;
