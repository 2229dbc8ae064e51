"""``heartbeat``: runs hourly from the schedule and records that the queue is alive.

The record (``service_state`` row ``heartbeat``) is what the watchdog reads to
alert when the heartbeat stops. Sends no message. Rerun-safe: an upsert.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from autom.db.queries import Q

if TYPE_CHECKING:
    from autom.handlers import HandlerContext
    from autom.jobs.models import Job

log = logging.getLogger("autom.handlers.heartbeat")


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Record the beat with the job id and when it ran."""
    await ctx.db.execute(Q.heartbeat_record, {"job_id": job.id})
    log.info("heartbeat", extra={"job_id": job.id, "kind": job.kind})
