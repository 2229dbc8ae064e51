"""The intake's hand-off: a lone delivery's job stored claimed and given to this process's workers.

``HandOff`` is what the worker pool offers (``WorkerPool``); ``handed_job`` reads the
job a hand-off stored, ``hand`` gives it to the pool (or back to pending). Why and
when: docs/design/intake.md, "The event store".
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Protocol

from autom.db.bridge import Row
from autom.jobs.models import Job

log = logging.getLogger("autom.intake")


class HandOff(Protocol):
    """Where a lone delivery's job goes when the intake stores it claimed (the worker pool of
    its own process, ``WorkerPool``; docs/design/intake.md)."""

    #: the lease a claim of this process takes
    lease_seconds: float

    def ready(self) -> bool:
        """Whether the pool would take a job now: it runs, is not stopping, has a free runner
        and no claimed job waits for one."""
        ...

    def take(self, job: Job, sent_at: float) -> bool:
        """Hold ``job``, claimed by a statement sent at ``sent_at`` (trio clock), and run it as
        any claim; False when the pool no longer takes jobs (then the caller gives it back)."""
        ...

    async def give_back(self, job: Job) -> None:
        """Put ``job`` (claimed, not started) back to pending at once, its attempt not counted."""
        ...


def handed_job(row: Row, lease_seconds: float | None = None) -> Job:
    """The handed-off job of an ``intake_store_handoff`` (with the ``lease_seconds`` it was
    claimed for) or a ``get_job`` row."""
    received_at = row.get("received_at")
    if received_at is None and lease_seconds is not None and row["event_id"] is not None:
        # the hand-off stores the event (received_at = now()) and claims its job (locked_until =
        # now() + the lease) in one transaction, where now() is one instant
        received_at = row["locked_until"] - timedelta(seconds=lease_seconds)
    return Job.from_row(row, id=int(row["id"]), received_at=received_at)


async def hand(handoff: HandOff, job: Job | None, sent: float) -> int:
    """Give ``job`` (claimed by a statement sent at ``sent``) to the pool; 1 if it took it."""
    if job is None:
        return 0
    if handoff.take(job, sent):
        return 1
    try:
        await handoff.give_back(job)  # the pool stopped meanwhile: pending again at once
    except Exception as exc:  # its lease runs out, and the workers claim it again
        log.warning("could not give back job %d, which the stopping worker pool did not take: %s",
                    job.id, exc)
    return 0
