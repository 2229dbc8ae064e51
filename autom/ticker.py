"""The schedule ticker: at start and every 30 s, enqueue each schedule's current slot.

The job key is ``kind:slot`` (keys are unique per kind), so however many replicas
tick, a slot becomes one job; a slot missed while the service was down is enqueued
as soon as it is back within the same period.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo

import trio

from autom.deps import Deps
from autom.jobs.models import NewJob
from autom.jobs.retry import describe
from autom.schedule import Schedule, job_key, slot

log = logging.getLogger("autom.schedule")

TICK_SECONDS = 30.0


def due_jobs(schedules: Sequence[Schedule], now: datetime, tz: tzinfo | None) -> list[NewJob]:
    """The jobs of the slots due at ``now`` (pure: the ticker's one decision)."""
    jobs = []
    for spec in schedules:
        key = slot(spec, now, tz)
        if key is not None:
            jobs.append(NewJob(spec.kind, payload={**spec.payload, "slot": key}, key=job_key(spec, key),
                               max_attempts=spec.max_attempts))
    return jobs


async def run_ticker(
    deps: Deps,
    schedules: Sequence[Schedule],
    tz: tzinfo | None,
    *,
    interval: float = TICK_SECONDS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Tick until ``deps.shutdown``; a database outage is retried every few seconds."""
    task_status.started()
    while not deps.shutdown.value:
        wait = interval
        jobs = due_jobs(schedules, datetime.now(UTC), tz)
        try:
            created = await deps.store.enqueue_many(jobs)
        except Exception as exc:  # database down or a statement error: tick again soon
            log.warning("schedule tick failed, retrying soon: %s", describe(exc))
            wait = min(interval, 5.0)
        else:
            for job_id in created:
                log.info("scheduled job enqueued", extra={"job_id": job_id})
            if created:
                deps.doorbell.set()
        with trio.move_on_after(wait):
            await deps.shutdown.wait_value(True)



