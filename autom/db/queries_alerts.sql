-- The alert outbox's queries (autom/alerts.py; the table and its trigger: migrations/0004).

-- name: alerts_claim
-- Take unsent alerts that are due and nobody's (no lease, or an expired one): the ones
-- this process's workers recorded (%(mine)s, job ids) at once, any other one once it is
-- %(grace)s seconds old (its process died or its bell was lost). The lease is the
-- claim: SKIP LOCKED plus the guarded update give each row to one sender of all replicas.
with due as (
    select id from alerts
     where sent_at is null and next_try_at <= now()
       and (claimed_until is null or claimed_until < now())
       and (job_id = any(%(mine)s::bigint[]) or created_at < now() - make_interval(secs => %(grace)s))
     order by id
     limit %(limit)s
     for update skip locked
)
update alerts a set claimed_until = now() + make_interval(secs => %(lease)s)
  from due where a.id = due.id
returning a.id, a.job_id, a.kind, a.attempts, a.error, a.tries;

-- name: alerts_renew
-- Keep holding alerts the throttle holds for the next summary.
update alerts set claimed_until = now() + make_interval(secs => %(lease)s)
 where id = any(%(ids)s::bigint[]) and sent_at is null;

-- name: alerts_mark_sent
-- Telegram accepted them (alone, or in one summary).
update alerts set sent_at = now(), sent_as = %(sent_as)s, claimed_until = null
 where id = any(%(ids)s::bigint[]) and sent_at is null;

-- name: alerts_release
-- Not delivered: free them for the next try after %(delay)s seconds; %(failed)s (0 or 1)
-- counts a failed delivery (rows that were only waiting behind it are not counted).
update alerts set claimed_until = null, tries = tries + %(failed)s::int,
                  next_try_at = now() + make_interval(secs => %(delay)s)
 where id = any(%(ids)s::bigint[]) and sent_at is null;

-- name: alerts_unsent_count
select count(*) from alerts where sent_at is null;

-- name: prune_sent_alerts
-- Sent alerts past retention, a batch at a time (unsent ones are kept until sent).
delete from alerts where id in (
    select id from alerts where sent_at < now() - make_interval(secs => %(keep_seconds)s)
    limit %(batch)s
);
