"""The one outcome writer: every write this process makes to the jobs it holds.

River's executor/completer split (``internal/jobcompleter``): the runners only
report how a run ended (``report``); this one task writes it, batched:

- ``done``: ``complete_batch`` (one statement for every finished run in the batch);
- ``retry``, ``failed``, ``released``, ``deferred``, ``cancelled``: ``settle_many`` (one statement);
- and between flushes, every ``lease/3``, the renewal of every claim still held
  (queued, running, or finished but not yet written);
- the pool's start order (``started``): the highest ticket whose run started, with
  the next completions, or alone when there are none (``record_starts``).

One writer instead of three (completer, failure path, renewer): two multi-row
statements of one process updating the same job and recipient rows in different
orders deadlocked under load (bench/load.py found it); a lock kept them apart
before. Now they cannot overlap at all, and there is no lock.

A renewal that fails (the database away or stalled) is retried soon; the runs it
could not extend reach their local deadlines (``Run``, autom/worker/pool.py) and
are cancelled there, before their leases run out in the database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import trio

from autom.bells import Doorbell
from autom.errors import QueryError
from autom.jobs.retry import RetryPolicy, describe
from autom.jobs.store import Ahead, Settle, Settled

if TYPE_CHECKING:
    from datetime import datetime

    from autom.jobs.models import Job
    from autom.jobs.retry import RetryPolicy
    from autom.worker.pool import Run

log = logging.getLogger("autom.worker")

#: how long the last flush at shutdown may take (shielded)
CLEANUP_SECONDS = 5.0

Status = Literal["done", "retry", "failed", "released", "deferred", "cancelled"]

_DONE = Settled("done", None)


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

    async def complete_batch(self, jobs: Sequence[Job], *,
                             starts: tuple[int, int] | None = None) -> tuple[set[int], bool]:
        """Mark claims done (and record ``starts``); (ids still held, whether a freed recipient
        has its next job due)."""
        ...

    async def settle_many(self, items: Sequence[Settle]) -> dict[int, Settled]:
        """Write the other outcomes; {id: what it became} for the claims still held."""
        ...

    async def save_run_logs(self, jobs: Sequence[Job], logs: Sequence[list[str]]) -> None:
        """Keep the lines these claims' handlers logged (``ctx.log``) with their "done" attempt."""
        ...

    async def renew(self, jobs: Sequence[Job]) -> dict[int, datetime]:
        """Extend the unexpired leases of these claims; {id: new end} for those still held."""
        ...

    def decide(self, job: Job, error: BaseException | str, *, retry: RetryPolicy | None = None) -> Settle:
        """The outcome of a run that raised ``error`` (``retry``: its kind's backoff, if it has one)."""
        ...


@dataclass(slots=True)
class Outcome:
    """How one run ended, as a runner reports it."""

    run: Run
    status: Status
    settle: Settle | None = None  # every status but "done"


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

    def written(self, outcome: Outcome, settled: Settled | None) -> None:
        """``outcome`` is recorded (``settled`` None: its claim had been lost, nothing changed)."""
        ...

    def flushed(self, freed: bool) -> None:
        """A flush ended; ``freed``: a recipient it freed has its next job due now."""
        ...

    def dropped(self, outcome: Outcome) -> None:
        """``outcome`` could not be written and never will be: forget its run."""
        ...


class Completer:
    """Writes outcomes in batches and renews leases between them; see the module docstring.

    The first outcome flushes at once; those that arrive during a flush go together
    in the next one (group commit).
    """

    def __init__(self, store: QueueStore, hooks: Hooks, *, renew_every: float,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self._store = store
        self._hooks = hooks
        self._pending: list[Outcome] = []
        self._bell = Doorbell()
        self._renew_every = max(0.05, renew_every)
        self._clock = clock
        # only this task flushes, but the shutdown drain must wait for a flush in flight
        # (which took the batch) rather than find nothing pending and return
        self._flushing = trio.Lock()
        self.flushes = 0
        self.renewals = 0
        self._renew_failing = False
        self._renew_asked = False
        # the pool's start order: (claimant, ticket) to record, and the highest recorded
        self._starts: tuple[int, int] | None = None
        self._carry: tuple[int, int] | None = None
        self.starts_written = 0
        self._starts_bell = Doorbell()

    def started(self, claimant: int, ticket: int) -> None:
        """Runs up to ``ticket`` of the pool ``claimant`` have started: record it soon."""
        self._starts = (claimant, ticket)
        self._bell.set()

    async def wait_started(self, ticket: int) -> None:
        """Wait until the start of ``ticket`` is recorded (an at-most-once run waits for it)."""
        while self.starts_written < ticket:
            seen = self._starts_bell.count
            await self._starts_bell.wait_after(seen)

    def renew_soon(self) -> None:
        """Renew at the next turn instead of at the next ``renew_every``: a claim may be gone (an
        operator cancelled a running job), and the renewal is what finds it and stops the handler."""
        self._renew_asked = True
        self._bell.set()

    def report(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for writing (the runner is free at once)."""
        self._pending.append(outcome)
        self._bell.set()

    @property
    def pending(self) -> int:
        """Outcomes reported but not yet written."""
        return len(self._pending)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write and renew forever (cancel it after ``drain``)."""
        task_status.started()
        next_renew = self._clock() + self._renew_every
        backoff = 0.2
        while True:
            if self._renew_asked or self._clock() >= next_renew:
                self._renew_asked = False
                ok = await self._renew()
                # a failed renewal is tried again soon: the leases are running out
                next_renew = self._clock() + (self._renew_every if ok else min(self._renew_every, 0.5))
                continue
            if self._pending or self._starts is not None:
                try:
                    await self._flush()
                    backoff = 0.2
                except Exception as exc:  # any database error: the outcomes wait, the service lives
                    log.warning("could not record %d outcomes, retrying in %.1fs: %s",
                                len(self._pending), backoff, describe(exc))
                    with trio.move_on_at(next_renew):
                        await trio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                continue
            seen = self._bell.count
            with trio.move_on_at(next_renew):
                await self._bell.wait_after(seen)

    async def _renew(self) -> bool:
        runs = self._hooks.held_runs()
        if not runs:
            return True
        started = self._clock()
        try:
            # bounded: a renewal stuck behind a stalled database must not stop the next one
            with trio.fail_after(max(self._renew_every, 1.0)):
                held = await self._store.renew([r.job for r in runs])
        except (Exception, trio.TooSlowError) as exc:
            # tried again every 0.5 s while it fails: one warning per outage, not two a second
            log.log(logging.DEBUG if self._renew_failing else logging.WARNING,
                    "could not renew %d leases (runs past their local deadline are stopped): %s",
                    len(runs), describe(exc))
            self._renew_failing = True
            return False
        if self._renew_failing:
            log.info("leases renewed again")
            self._renew_failing = False
        self.renewals += 1
        for run in runs:
            if run.job.id in held:
                self._hooks.renewed(run, started)
            else:
                self._hooks.lost(run)
        return True

    async def _flush(self) -> None:
        async with self._flushing:
            await self._flush_now()

    async def _flush_now(self) -> None:
        batch = self._pending
        self._pending = []
        self._carry, self._starts = self._starts, None  # the first "done" statement takes it along
        try:
            await self._write_batch(batch)
            if self._carry is not None:
                await self._store.record_starts(*self._carry)
                self._recorded(self._carry)
        finally:
            if self._carry is not None and (self._starts is None or self._starts[1] < self._carry[1]):
                self._starts = self._carry  # not written: the next flush tries again
            self._carry = None

    def _recorded(self, starts: tuple[int, int]) -> None:
        self._carry = None
        self.starts_written = max(self.starts_written, starts[1])
        self._starts_bell.set()

    async def _write_batch(self, batch: list[Outcome]) -> None:
        if not batch:
            return
        # two statements: "done" for every completion, settle_many for the rest; each
        # group is written (and reported) on its own, so a failure of the second does
        # not put the first back to be written twice
        groups = [g for g in ([o for o in batch if o.status == "done"],
                              [o for o in batch if o.status != "done"]) if g]
        freed = False
        try:
            for index, group in enumerate(groups):
                try:
                    freed |= await self._write_group(group)
                except BaseException:
                    self._pending[:0] = [o for g in groups[index:] for o in g]
                    raise
        finally:
            self._hooks.flushed(freed)  # what was written may have freed a recipient, even so
        self.flushes += 1

    async def _write_group(self, group: list[Outcome]) -> bool:
        """Write ``group`` in one statement; if PostgreSQL refuses it for good (one outcome
        poisons it), one by one, dropping only the refused ones. Raises (nothing written of
        what is left) on any other error. Returns whether it freed a recipient."""
        try:
            return await self._write(group)
        except QueryError as exc:
            if exc.transient:
                raise
            if len(group) == 1:
                self._drop(group[0], exc)
                return False
        freed = False
        for index, outcome in enumerate(group):
            try:
                freed |= await self._write([outcome])
            except QueryError as exc:
                if exc.transient:
                    del group[:index]  # written already: the caller puts back the rest
                    raise
                self._drop(outcome, exc)
            except BaseException:
                del group[:index]
                raise
        return freed

    async def _write(self, group: list[Outcome]) -> bool:
        """Write outcomes of one kind (all "done", or none) and report them to the pool."""
        if group[0].status == "done":
            starts = self._carry
            if starts is None:
                held, more = await self._store.complete_batch([o.run.job for o in group])
            else:
                held, more = await self._store.complete_batch([o.run.job for o in group], starts=starts)
                self._recorded(starts)
            logged = [o.run for o in group if o.run.log is not None and o.run.job.id in held]
            if logged:  # only runs whose handler used ctx.log: the usual "done" writes nothing more
                await self._store.save_run_logs([r.job for r in logged], [r.log.lines for r in logged if r.log])
            for o in group:
                self._hooks.written(o, _DONE if o.run.job.id in held else None)
            return more
        settled = await self._store.settle_many([o.settle for o in group if o.settle is not None])
        for o in group:
            self._hooks.written(o, settled.get(o.run.job.id))
        # a failed or waiting job freed its recipient too (its next job may be due)
        return any(o.run.job.recipient is not None for o in group)

    def _drop(self, outcome: Outcome, exc: QueryError) -> None:
        job = outcome.run.job
        log.error("could not record the %s of job %d (SQLSTATE %s); it runs again when its lease runs out",
                  outcome.status, job.id, exc.sqlstate or "none", extra={"job_id": job.id, "kind": job.kind})
        self._hooks.dropped(outcome)

    async def drain(self) -> None:
        """Write what is still pending (shielded, bounded): called once at shutdown."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
            while self._pending or self._flushing.locked():
                try:
                    await self._flush()
                except Exception as exc:
                    log.warning("could not record outcomes at shutdown: %s", describe(exc))
                    await trio.sleep(0.5)
        if self._pending:
            log.error("%d outcomes not recorded; those jobs run again when their leases expire",
                      len(self._pending))


def wall_delay(run_at: datetime | None) -> float:
    """Seconds from now until ``run_at`` (0 when it is due or unknown)."""
    return max(0.0, run_at.timestamp() - time.time()) if run_at is not None else 0.0
