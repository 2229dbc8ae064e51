"""``Run``: one claim of one job in this process, from its claim to its recorded outcome.

A run carries what a handler's context needs to act for its claim: the job and
its lease (``key`` = ``(id, lease)``), the cancel scope the handler
runs in (``scope``, set when the run starts: its runner's), and the run's
*local* deadline, the local lease end: when the claim was sent (or the last
successful renewal), plus the lease, less a safety margin. Only a successful
renewal moves it; when it passes, the pool cancels the run's scope and drops
the claim, so a handler never outlives its lease.

The scope is the runner's, kept from run to run until one of its runs is
cancelled, and the deadline is a number the pool's watch compares (``WorkerPool``):
entering and leaving a trio cancel scope with a deadline for every job cost
about 5 µs of the worker's ~33 µs of CPU per job (bench/RESULTS.md, Speed
round three).

``complete_in(tx)`` marks the job done inside a transaction the handler's
context opened: the handler's own writes and the "done" commit together, or
neither does (fenced: ``LeaseLost`` when this claim no longer holds the job, so
the transaction rolls back). The runner then writes nothing more for the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

import trio

from autom.errors import LeaseLost
from autom.jobs.outcome import Outcome

if TYPE_CHECKING:
    from collections.abc import Sequence

    from autom.db.bridge import Tx
    from autom.jobs.models import Job
    from autom.jobs.outcome import Written
    from autom.worker.tracebacks import RunLog

State = Literal["queued", "running", "finishing", "written", "lost"]


def lease_margin(lease_seconds: float) -> float:
    """How long before the lease ends a run is stopped: a tenth of the lease, 50 ms to 5 s.

    It covers the clock rates of this process and the database drifting apart and the
    cancelled handler's own clean-up, never a network round trip (the local deadline
    is counted from when the claim or renewal was *sent*, which is before the database
    set the lease).
    """
    return min(5.0, max(0.05, lease_seconds * 0.1))


class _Writes(Protocol):
    async def write(self, outcomes: Sequence[Outcome], *, tx: Tx | None = None,
                    starts: tuple[int, int] | None = None) -> tuple[dict[int, Written], bool]: ...


class Run:
    """One claim of ``job`` held by this process; see the module docstring."""

    __slots__ = ("_store", "confirmed", "deadline", "job", "key", "log", "lost", "scope", "started", "state",
                 "ticket")

    def __init__(self, job: Job, deadline: float, store: Any, *, confirmed: bool = True, ticket: int = 0) -> None:
        self.job = job
        #: the claim's place in the pool's start order (0: counted as started with the claim)
        self.ticket = ticket
        #: the claim: (job id, lease value)
        self.key: tuple[int, int] = (job.id, job.lease)
        #: the local lease end (trio clock)
        self.deadline = deadline
        #: the handler runs in this scope (its runner's; None until the run starts): cancelling it
        #: stops the run
        self.scope: trio.CancelScope | None = None
        self.started = 0.0
        self.state: State = "queued"
        #: the claim is known to be gone (a renewal did not find it, or the deadline passed)
        self.lost = False
        self._store: _Writes = store
        #: the claim is on disk: committed durably, or confirmed since (False: an
        #: asynchronous claim the pool's confirmer has not confirmed yet)
        self.confirmed = confirmed
        #: the lines the handler logged through ``ctx.log`` (None until it logs one)
        self.log: RunLog | None = None

    def expired(self) -> bool:
        """Whether the local deadline has passed (the lease may be running out in the database)."""
        return trio.current_time() >= self.deadline

    def extend(self, deadline: float) -> None:
        """A renewal succeeded: move the local deadline to ``deadline`` (never back, never once lost)."""
        if not self.lost and deadline > self.deadline:
            self.deadline = deadline

    async def complete_in(self, tx: Tx) -> None:
        """Write this claim's "done" inside ``tx`` (it commits with the handler's writes); the
        run's state becomes ``written``, so the pool writes nothing more for it.

        Raises ``LeaseLost`` (and writes nothing) when the claim is no longer held; the
        caller lets it propagate so ``tx`` rolls back. Call it last in the transaction.
        """
        if self.lost or self.expired():
            raise LeaseLost(f"job {self.job.id}: claim {self.job.generation} is no longer held")
        written, _more = await self._store.write([Outcome.done(self.job)], tx=tx)
        if self.job.id not in written:
            self.lost = True
            raise LeaseLost(f"job {self.job.id}: claim {self.job.generation} is no longer held")
        self.state = "written"
