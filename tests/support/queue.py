"""Queue steps that only tests need: the service claims in batches and writes every outcome
through ``JobStore.write``.

``claim_one`` and ``complete`` read better in a test that walks one job through its
states than ``claim(1)`` and ``write([Outcome.done(job)])``; they are exactly those calls.
``complete_many``, ``complete_batch``, ``fail``, ``release`` and ``settle_many`` are
``JobStore.write`` with the outcomes they name (they were the store's methods once).
``sleeping_handler`` is a handler that runs until it is stopped, telling how it ended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import trio

from autom.jobs.models import Job
from autom.jobs.outcome import Outcome, Written
from autom.jobs.retry import RetryPolicy
from autom.jobs.store import JobStore


async def claim_one(store: JobStore) -> Job | None:
    """Claim one due job, or None when nothing is due."""
    jobs = await store.claim(1)
    return jobs[0] if jobs else None


async def complete(store: JobStore, job: Job) -> bool:
    """Mark the job done; False when this claim no longer holds it."""
    return job.id in await complete_many(store, [job])


async def complete_many(store: JobStore, jobs: Iterable[Job]) -> set[int]:
    """Mark several claims done in one statement; the ids that were still held."""
    held, _more = await complete_batch(store, jobs)
    return held


async def complete_batch(store: JobStore, jobs: Iterable[Job]) -> tuple[set[int], bool]:
    """``complete_many``, and whether a recipient it freed has its next job due now."""
    written, more = await store.write([Outcome.done(job) for job in jobs])
    return set(written), more


async def settle_many(store: JobStore, outcomes: Sequence[Outcome]) -> dict[int, Written]:
    """Write outcomes; what each held claim's job became, by id."""
    written, _more = await store.write(outcomes)
    return written


async def release(store: JobStore, jobs: Iterable[Job], reason: str | None = None) -> set[int]:
    """Put unfinished claims back to pending now, the attempt not counted; the ids still held."""
    return set(await settle_many(store, [Outcome.released(job, reason) for job in jobs]))


@dataclass(frozen=True)
class Failed:
    """What ``fail`` did: ``pending`` (retry at ``run_at``), ``failed`` (for good: its alert),
    or ``stale`` (the claim no longer held the job: nothing changed)."""

    status: Literal["pending", "failed", "stale"]
    error: str
    run_at: datetime | None = None

    @property
    def final(self) -> bool:
        """True when the job failed for good by this call."""
        return self.status == "failed"


async def fail(store: JobStore, job: Job, error: BaseException | str, *, retry: RetryPolicy | None = None) -> Failed:
    """Record a failed attempt now, as the worker would (``JobStore.decide``): a retry later,
    or failed for good."""
    outcome = store.decide(job, error, retry=retry)
    written = (await settle_many(store, [outcome])).get(job.id)
    if written is None:
        return Failed("stale", outcome.error or "")
    return Failed("failed" if written.status == "failed" else "pending", outcome.error or "", written.run_at)


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


async def complete_in(store: JobStore, tx: Any, job: Job) -> bool:
    """Mark the claim done inside ``tx``; False when it is no longer held (roll back then)."""
    written, _more = await store.write([Outcome.done(job)], tx=tx)
    return job.id in written
