"""``maintenance.prune``: retention, run hourly from the schedule (one replica per slot).

``handle`` deletes what the retention settings let go, in batches of ``BATCH`` so no
statement holds locks for long, within ``BUDGET_SECONDS`` a run. Failed jobs stay
until retried or deleted by hand; keyed jobs at least ``KEY_KEEP_SECONDS``, and each
kind's newest schedule slot job however old, so a slot is never enqueued twice.
Rerun-safe: deleting what is already gone deletes nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
import trio.lowlevel

from autom.db.queries import Q

if TYPE_CHECKING:
    from autom.handlers import HandlerContext
    from autom.jobs.models import Job

log = logging.getLogger("autom.retention")

BATCH = 1000
#: a keyed job (schedule slot, sender event id) is never pruned sooner than this; the
#: newest slot job of a kind is kept longer (its slot may last longer: a monthly cron)
KEY_KEEP_SECONDS = 8 * 86400
#: one run stops after this long and leaves the rest to the next hour
BUDGET_SECONDS = 60.0


async def _prune(ctx: HandlerContext, query: str, params: dict[str, float]) -> int:
    total = 0
    with trio.move_on_after(BUDGET_SECONDS):
        while True:
            deleted = await ctx.db.execute(query, {**params, "batch": BATCH})
            total += deleted
            if deleted < BATCH:
                break
            await trio.lowlevel.checkpoint()  # let other work in between batches
    return total


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Prune, each kind of row in batches (``_prune``), and log how many went.

    Done jobs older than RETAIN_DONE_DAYS; events older than RETAIN_EVENTS_DAYS that no
    unfinished (pending, running or failed) job references; operator actions older than
    RETAIN_EVENTS_DAYS; lock rows of recipients with nothing queued; alerts sent more than
    RETAIN_DONE_DAYS ago (unsent ones wait to be sent); ``ctx.once`` keys older than the
    longer of the two retentions (until then every job or event that could repeat the
    effect is still there to be retried or replayed); the intake's commit records;
    Telegram send-limit rows of chats quiet for an hour and reservations whose job never
    came back (autom/limits.py).
    """
    settings = ctx.settings
    jobs = await _prune(ctx, Q.prune_done_jobs, {
        "keep_seconds": settings.retain_done_days * 86400, "key_keep_seconds": KEY_KEEP_SECONDS,
    })
    events = await _prune(ctx, Q.prune_events, {"keep_seconds": settings.retain_events_days * 86400})
    await _prune(ctx, Q.prune_audit, {"keep_seconds": settings.retain_events_days * 86400})
    recipients = await _prune(ctx, Q.prune_recipients, {})
    alerts = await _prune(ctx, Q.prune_sent_alerts, {"keep_seconds": settings.retain_done_days * 86400})
    once_keep_days = max(settings.retain_done_days, settings.retain_events_days)
    once_keys = await _prune(ctx, Q.prune_once_keys, {"keep_seconds": once_keep_days * 86400})
    await _prune(ctx, Q.prune_intake_commits, {})
    await _prune(ctx, Q.prune_telegram_chats, {})  # send-limit rows of chats long quiet
    await _prune(ctx, Q.prune_telegram_reservations, {})  # slots whose job never came back
    log.info("pruned %d done jobs, %d events, %d idle recipients, %d sent alerts, %d once keys", jobs, events,
             recipients, alerts, once_keys, extra={"job_id": job.id, "kind": job.kind})
