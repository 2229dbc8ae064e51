-- The alert outbox's queries (autom/alerts.py; the table and its trigger: migrations/0004).

-- name: alerts_claim
-- Take unsent alerts that are due and nobody's (no lease, or an expired one): the ones
-- this process's workers recorded (%(mine)s, job ids) at once, any other one once it is
-- %(grace)s seconds old (its process died or its bell was lost). The lease is the
-- claim: SKIP LOCKED plus the guarded update give each row to one sender of all replicas.
-- %(claimant)s, a token new for every claim, marks whose claim it is: renew, mark and
-- release match it, so a sender whose lease ran out and whose rows another sender
-- took changes nothing of theirs (migrations/0006).
with due as (
    select id from alerts
     where sent_at is null and next_try_at <= now()
       and (claimed_until is null or claimed_until < now())
       and (job_id = any(%(mine)s::bigint[]) or created_at < now() - make_interval(secs => %(grace)s))
     order by id
     limit %(limit)s
     for update skip locked
)
update alerts a set claimed_until = now() + make_interval(secs => %(lease)s), claimant = %(claimant)s
  from due where a.id = due.id
returning a.id, a.job_id, a.kind, a.attempts, a.error, a.tries, a.claimant;

-- name: alerts_renew
-- Keep holding these claims (before each send, and the ones the throttle holds for the
-- next summary); returns the ids still held. A row another sender claimed since is not
-- returned: this sender must not send it.
update alerts a set claimed_until = now() + make_interval(secs => %(lease)s)
  from unnest(%(ids)s::bigint[], %(claimants)s::text[]) as t (id, claimant)
 where a.id = t.id and a.claimant = t.claimant and a.sent_at is null
returning a.id;

-- name: alerts_mark_sent
-- Telegram accepted them (alone, or in one summary); only this sender's claims.
update alerts a set sent_at = now(), sent_as = %(sent_as)s, claimed_until = null
  from unnest(%(ids)s::bigint[], %(claimants)s::text[]) as t (id, claimant)
 where a.id = t.id and a.claimant = t.claimant and a.sent_at is null;

-- name: alerts_release
-- Not delivered: free this sender's claims for the next try after %(delay)s seconds;
-- %(failed)s (0 or 1) counts a failed delivery (rows that were only waiting behind it
-- are not counted).
update alerts a set claimed_until = null, tries = a.tries + %(failed)s::int,
                    next_try_at = now() + make_interval(secs => %(delay)s)
  from unnest(%(ids)s::bigint[], %(claimants)s::text[]) as t (id, claimant)
 where a.id = t.id and a.claimant = t.claimant and a.sent_at is null;

-- name: alerts_unsent_count
select count(*) from alerts where sent_at is null;

-- name: prune_sent_alerts
-- Sent alerts past retention, a batch at a time (unsent ones are kept until sent).
delete from alerts where id in (
    select id from alerts where sent_at < now() - make_interval(secs => %(keep_seconds)s)
    limit %(batch)s
);

-- name: alerts_health
-- For /health and /metrics: unsent alerts, how many of them wait longer than
-- %(stale)s seconds, how many longer than %(held)s (held back) but not that long, and the outcome of the last delivery anyone tried (a
-- service_state row, so every replica sees it, also an intake-only one).
select (select count(*) from alerts where sent_at is null) as unsent,
       (select count(*) from alerts
         where sent_at is null and created_at < now() - make_interval(secs => %(stale)s)) as stale,
       (select count(*) from alerts
         where sent_at is null and created_at < now() - make_interval(secs => %(held)s)
           and created_at >= now() - make_interval(secs => %(stale)s)) as held,
       (select value from service_state where name = 'alert_delivery') as delivery;

-- name: alert_delivery_note
-- The outcome of an alert delivery: written only when it differs from the last one,
-- so an alert chat that keeps accepting costs no write.
insert into service_state as s (name, value, updated_at)
values ('alert_delivery', jsonb_build_object('ok', %(ok)s::boolean, 'error', %(error)s::text), now())
on conflict (name) do update set value = excluded.value, updated_at = excluded.updated_at
    where s.value is distinct from excluded.value;
