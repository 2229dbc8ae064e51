"""``site.form``, ``github.event``, ``stripe.event``, ``standard.event``: log what arrived.

These are the places a business plugs its own automation in; out of the box
they log the kind, the event id and the payload's top-level keys (never values,
which may hold personal data). Rerun-safe: logging twice is harmless.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autom.handlers import HandlerContext
    from autom.jobs.models import Job

log = logging.getLogger("autom.handlers.events")


async def handle(ctx: HandlerContext, job: Job) -> None:
    """Log one line naming the event and the payload's keys."""
    keys = ",".join(sorted(str(k) for k in job.payload)[:20])
    log.info("%s received (keys: %s)", job.kind, keys or "-", extra={
        "job_id": job.id, "kind": job.kind, "event_id": job.event_id, "attempt": job.attempts,
    })
