"""Single-job queue steps that only tests need: the service claims and completes in batches.

``claim_one`` and ``complete`` read better in a test that walks one job through its
states than ``claim(1)`` and ``complete_many([job])``; they are exactly those calls.
``sleeping_handler`` is a handler that runs until it is stopped, telling how it ended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from autom.jobs.models import Job
from autom.jobs.store import JobStore


async def claim_one(store: JobStore) -> Job | None:
    """Claim one due job, or None when nothing is due."""
    jobs = await store.claim(1)
    return jobs[0] if jobs else None


async def complete(store: JobStore, job: Job) -> bool:
    """Mark the job done; False when this claim no longer holds it."""
    return job.id in await store.complete_many([job])


def sleeping_handler(started: trio.Event | None = None) -> tuple[Callable[[Any, Job], Awaitable[None]], list[str]]:
    """A handler that sleeps 100 s (setting ``started`` first, when given), and the list it appends
    how it ended to: "returned", or "cancelled" (the worker stopped it)."""
    ended: list[str] = []

    async def long(ctx: Any, job: Job) -> None:
        if started is not None:
            started.set()
        try:
            await trio.sleep(100)
            ended.append("returned")
        except trio.Cancelled:
            ended.append("cancelled")
            raise

    return long, ended
