"""The one writer: every write this process makes to the jobs it holds, from one task.

Runners ``report`` how each run ended (an ``Outcome``); the writer records them in batches
through ``JobStore.write`` (what arrives during a flush goes in the next), renews every
held claim each ``lease/3`` between flushes, and records the pool's start order. Only
one task writes these rows, so two statements of this process never update them at
once (that deadlocked). An outcome the database refuses is dropped alone; any other
error is retried. Public name: ``Completer``. Design notes: docs/design/worker.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from autom.bells import Doorbell
from autom.errors import QueryError
from autom.jobs.retry import describe

if TYPE_CHECKING:
    from autom.jobs.outcome import Outcome
    from autom.worker.run import Hooks, QueueStore, Run

log = logging.getLogger("autom.worker")

#: how long the last flush at shutdown may take (shielded)
CLEANUP_SECONDS = 5.0


class Completer:
    """Writes outcomes in batches and renews leases between them; see the module docstring.

    The first outcome flushes at once; those that arrive during a flush go together
    in the next one (group commit).
    """

    def __init__(self, store: QueueStore, hooks: Hooks, *, renew_every: float,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self._store = store
        self._hooks = hooks
        self._pending: list[tuple[Run, Outcome]] = []
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
        self._live = False  # the task runs and has not drained: a report is written by it

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

    def report(self, run: Run, outcome: Outcome) -> None:
        """Queue ``run``'s ``outcome`` for writing (the runner is free at once)."""
        self._pending.append((run, outcome))
        self._bell.set()

    async def hand_in(self, run: Run, outcome: Outcome) -> None:
        """``report`` from outside the pool's tasks: while this writer's task is not running
        (before it starts, after its drain) the outcome is written now, as ``drain`` writes."""
        self.report(run, outcome)
        if not self._live:
            await self.drain()

    @property
    def pending(self) -> int:
        """Outcomes reported but not yet written."""
        return len(self._pending)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write and renew forever (cancel it after ``drain``)."""
        self._live = True
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

    async def _write_batch(self, batch: list[tuple[Run, Outcome]]) -> None:
        if not batch:
            return
        # the "done" outcomes and the rest are two statements: each group is written (and
        # reported) on its own, so a failure of the second does not put the first back to
        # be written twice
        groups = [g for g in ([p for p in batch if p[1].status == "done"],
                              [p for p in batch if p[1].status != "done"]) if g]
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

    async def _write_group(self, group: list[tuple[Run, Outcome]]) -> bool:
        """Write ``group`` in one statement; if PostgreSQL refuses it for good (one outcome
        poisons it), one by one, dropping only the refused ones. Raises (nothing written of
        what is left) on any other error. Returns whether it freed a recipient."""
        try:
            return await self._write(group)
        except QueryError as exc:
            if exc.transient:
                raise
            if len(group) == 1:
                self._drop(*group[0], exc)
                return False
        freed = False
        for index, pair in enumerate(group):
            try:
                freed |= await self._write([pair])
            except QueryError as exc:
                if exc.transient:
                    del group[:index]  # written already: the caller puts back the rest
                    raise
                self._drop(*pair, exc)
            except BaseException:
                del group[:index]
                raise
        return freed

    async def _write(self, group: list[tuple[Run, Outcome]]) -> bool:
        """Write outcomes of one kind (all "done", or none) and report them to the pool."""
        starts = self._carry if group[0][1].status == "done" else None  # the start order goes with "done"
        written, more = await self._store.write([o for _, o in group], starts=starts)
        if starts is not None:
            self._recorded(starts)
        for run, outcome in group:
            self._hooks.written(run, outcome, written.get(outcome.job.id))
        return more

    def _drop(self, run: Run, outcome: Outcome, exc: QueryError) -> None:
        job = outcome.job
        log.error("could not record the %s of job %d (SQLSTATE %s); it runs again when its lease runs out",
                  outcome.status, job.id, exc.sqlstate or "none", extra={"job_id": job.id, "kind": job.kind})
        self._hooks.dropped(run, outcome)

    async def drain(self) -> None:
        """Write what is still pending (shielded, bounded): at shutdown; the task writes no more."""
        self._live = False
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
