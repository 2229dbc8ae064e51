"""``Run``: one claim of one job in this process, from its claim to its recorded outcome;
``QueueStore``: what the worker needs of the queue; ``Hooks``: what its writer tells the pool.

A run holds its job and lease (``key`` = ``(id, lease)``), the cancel scope its handler
runs in (its runner's), and its *local* deadline: when the claim (or the last successful
renewal) was sent, plus the lease, less a margin. Only a renewal moves it; the pool stops
the run there, so a handler never outlives its lease. ``complete_in`` writes the run's
"done" inside its handler's transaction. Design notes: docs/design/worker.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

import trio

from autom.errors import LeaseLost
from autom.jobs.outcome import Outcome

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from autom.db.bridge import Tx
    from autom.jobs.models import Job
    from autom.jobs.outcome import Written
    from autom.jobs.retry import RetryPolicy
    from autom.jobs.store import Ahead
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


class QueueStore(Protocol):
    """What the worker needs of the queue (``JobStore``; unit tests pass a fake)."""

    lease_seconds: float
    retry: RetryPolicy

    async def claim(self, n: int = 1, *, durable: bool = True, ahead: Ahead | None = None) -> list[Job]:
        """Claim up to ``n`` due jobs (``durable`` False: committed asynchronously, to be confirmed;
        ``ahead``: the pool's start order, filled with each job's ticket)."""
        ...

    async def register_claimant(self) -> int:
        """A new row for this pool's start order; its id."""
        ...

    async def record_starts(self, claimant: int, upto: int) -> None:
        """Every run of ``claimant`` up to ticket ``upto`` has started."""
        ...

    async def confirm(self, jobs: Sequence[Job]) -> set[int]:
        """The ids of these claims that are held, made durable by this call."""
        ...

    async def retire_idle(self, n: int = 100) -> int:
        """Sweep: retire recipients whose line has nothing due (the fetcher, going idle)."""
        ...

    async def write(self, outcomes: Sequence[Outcome], *, tx: Tx | None = None,
                    starts: tuple[int, int] | None = None) -> tuple[dict[int, Written], bool]:
        """Record outcomes of claims still held (and ``starts``); (what each held claim's job became,
        whether a recipient they freed may have its next job due)."""
        ...

    async def renew(self, jobs: Sequence[Job]) -> dict[int, datetime]:
        """Extend the unexpired leases of these claims; {id: new end} for those still held."""
        ...

    def decide(self, job: Job, error: BaseException | str, *, retry: RetryPolicy | None = None) -> Outcome:
        """The outcome of a run that raised ``error`` (``retry``: its kind's backoff, if it has one)."""
        ...


class Hooks(Protocol):
    """What the writer tells the pool (``WorkerPool`` implements it)."""

    def held_runs(self) -> list[Run]:
        """Every claim this process holds now (to renew)."""
        ...

    def renewed(self, run: Run, started: float) -> None:
        """``run``'s lease was extended by a renewal sent at ``started`` (trio clock)."""
        ...

    def lost(self, run: Run) -> None:
        """``run``'s claim is no longer held: stop it, drop it."""
        ...

    def written(self, run: Run, outcome: Outcome, result: Written | None) -> None:
        """``run``'s ``outcome`` is recorded (``result`` None: its claim had been lost, nothing changed)."""
        ...

    def flushed(self, freed: bool) -> None:
        """A flush ended; ``freed``: a recipient it freed has its next job due now."""
        ...

    def dropped(self, run: Run, outcome: Outcome) -> None:
        """``run``'s ``outcome`` could not be written and never will be: forget the run."""
        ...


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
        self._store: QueueStore = store
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
