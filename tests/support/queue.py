"""Single-job queue steps that only tests need: the service claims and completes in batches.

``claim_one`` and ``complete`` read better in a test that walks one job through its
states than ``claim(1)`` and ``complete_many([job])``; they are exactly those calls.
"""

from __future__ import annotations

from autom.jobs.models import Job
from autom.jobs.store import JobStore


async def claim_one(store: JobStore) -> Job | None:
    """Claim one due job, or None when nothing is due."""
    jobs = await store.claim(1)
    return jobs[0] if jobs else None


async def complete(store: JobStore, job: Job) -> bool:
    """Mark the job done; False when this claim no longer holds it."""
    return job.id in await store.complete_many([job])
